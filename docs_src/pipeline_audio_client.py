"""The `openai` client against `otel-llm serve-pipeline`: a streamed chat request that asks for
audio, its PCM16 collected from the `delta.audio` chunks.

    python docs_src/pipeline_audio_client.py [--url http://127.0.0.1:8000]

Without `--url` it starts `otel-llm serve-pipeline --model dummy --in-process` on a free local
port for the run (what the docs tests do), and stops it at the end."""

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def audio_request(base_url: str) -> int:
    # --8<-- [start:client]
    import base64

    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="x")  # base_url: "http://127.0.0.1:8000"
    pcm = bytearray()
    stream = client.chat.completions.create(
        model="dummy", messages=[{"role": "user", "content": "Say hello"}], max_tokens=32, stream=True,
        modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
    for chunk in stream:
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        if audio and audio.data:  # base64 PCM16; audio.transcript: the text it speaks
            pcm += base64.b64decode(audio.data)
    print(len(pcm) // 2, "samples at 24 kHz")
    # --8<-- [end:client]
    return len(pcm) // 2


@contextlib.contextmanager
def pipeline_server():
    with socket.socket() as s:  # a free port, not a fixed one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "otel_llm", "serve-pipeline", "--model", "dummy", "--in-process",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise SystemExit("serve-pipeline did not start:\n" + log.read().decode(errors="replace")[-3000:])
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running serve-pipeline server (default: start one)")
    args = parser.parse_args()
    if args.url:
        samples = audio_request(args.url)
    else:
        with pipeline_server() as url:
            samples = audio_request(url)
    assert samples > 0
