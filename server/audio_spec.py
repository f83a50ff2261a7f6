"""OpenAI's chat audio output, as the API defines it: the voices, the formats, and the one format
this server streams (pcm16 at 24 kHz). Plain constants, importable without the `serve` extra
(the CLI's flags and the synthesisers' configs use them)."""

MODALITIES = ("text", "audio")
AUDIO_FORMATS = ("wav", "aac", "mp3", "flac", "opus", "pcm16")
AUDIO_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
                "marin", "cedar")
SUPPORTED_AUDIO_FORMAT = "pcm16"  # 16-bit little-endian mono PCM at PCM16_SAMPLE_RATE_HZ
PCM16_SAMPLE_RATE_HZ = 24000  # OpenAI's pcm16: "Only a 24kHz sample rate is supported"
