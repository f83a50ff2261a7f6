"""The text-to-speech pipeline's parts (`otel-llm serve-pipeline`, issue 13).

Public surface: `SynthConfig`, `Synth`, `make_synth`, `ToneSynth`, `EspeakSynth`, `PcmStream`
(text -> PCM16 at 24 kHz, at once or incrementally), and `audio_chunks` (OpenAI's streamed
`delta.audio` and `message.audio` payloads). The server's own modules: `pipeline_config`
(`PipelineServerConfig`), `talker` / `talker_session` / `talker_messages` (stage 1's replicas and
what crosses to them as bytes), `pipeline_serving` (a request through both stages) and
`pipeline_app` (what `create_app(pipeline=...)` adds).
"""

from otel_llm.server.pipeline.espeak_synth import EspeakSynth
from otel_llm.server.pipeline.pcm_stream import PcmStream
from otel_llm.server.pipeline.synth import Synth, make_synth
from otel_llm.server.pipeline.synth_config import SynthConfig
from otel_llm.server.pipeline.tone_synth import ToneSynth

__all__ = ["EspeakSynth", "PcmStream", "Synth", "SynthConfig", "ToneSynth", "make_synth"]
