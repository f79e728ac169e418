"""Speech through the gateway vs the engine alone: the real-time factor of STT and TTS.

The daemon runs both speech lanes on the test models (whisper tiny.en on the faster-whisper
host, the joe-us voice on the piper host); the harness reads each child's argv from /proc
and starts a second host with exactly the same flags on another port. The clip is one
paragraph the voice speaks once, at the start (the same WAV for every transcription).
Each run sends the same requests through the gateway (A) and straight to the direct host
(B), one after the other and one at a time as the lanes run them (A B, then B A, …):

- STT: ``POST /v1/audio/transcriptions`` of the clip (``json``, the default beam): real-time
  factor = the request's wall time ÷ the clip's duration;
- TTS: ``POST /v1/audio/speech`` of the paragraph (``wav``): wall time ÷ the duration of
  the audio it returned.

A run's real-time factor for a path is the median over its requests; its gateway ÷ direct
ratio is the median over its pairs (each request against its neighbour on the other path,
so that the machine's load drifting over a run cancels out; 1.0: the gateway adds nothing,
above: slower). The result is the median of the runs with their range. Beside the ratios:
the wall time the gateway adds to an STT request (A - B over the pairs, in ms) and the
daemon's own CPU per request through it (its process alone, not its engine children,
summed over the run's gateway requests and divided by their number), which the
machine's load does not inflate the way it does wall time.
"""

from __future__ import annotations

import contextlib
import io
import time
import wave
from statistics import median
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import (
    DirectEngine,
    daemon_commands,
    engine_config,
    engine_of,
    log,
    redact,
    running_daemon,
    wait_http,
)
from bench._stats import summarize
from bench._system import cpu_seconds

__all__ = ["TITLE", "run"]

TITLE = "Speech: real-time factor, gateway vs engine alone"
STT = "whisper-tiny.en"
TTS = "piper-joe-us"
TEXT = (
    "The quick brown fox jumps over the lazy dog. A gateway should cost a speech engine "
    "almost nothing: the audio goes in, the transcript comes out, and the time between "
    "is the engine's own. This paragraph is long enough to make both sides work for a while, "
    "and short enough to repeat several times in one run."
)
QUICK_TEXT = "The quick brown fox jumps over the lazy dog."
"""What ``--quick`` (the smoke test) speaks and hears: the plumbing, not the figures."""


def _duration_s(wav_bytes: bytes) -> float:
    with wave.open(io.BytesIO(wav_bytes)) as w:
        return w.getnframes() / w.getframerate()


def _speak(client: httpx.Client, url: str, headers: dict[str, str], text: str) -> tuple[float, float]:
    """Wall time and audio duration of one synthesis of the paragraph."""
    t0 = time.perf_counter()
    r = client.post(
        f"{url}/v1/audio/speech",
        json={"model": TTS, "input": text, "response_format": "wav"},
        headers=headers,
    )
    took = time.perf_counter() - t0
    r.raise_for_status()
    return took, _duration_s(r.content)


def _hear(client: httpx.Client, url: str, headers: dict[str, str], clip: bytes) -> tuple[float, str]:
    """Wall time and text of one transcription of the clip."""
    t0 = time.perf_counter()
    r = client.post(
        f"{url}/v1/audio/transcriptions",
        data={"model": STT},
        files={"file": ("clip.wav", clip, "audio/wav")},
        headers=headers,
    )
    took = time.perf_counter() - t0
    r.raise_for_status()
    return took, str(r.json()["text"])


Target = tuple[str, dict[str, str]]
"""A base URL and the headers its requests need."""


def _one_run(
    client: httpx.Client,
    targets: dict[str, dict[str, Target]],
    clip: bytes,
    count: int,
    daemon_pid: int,
    text: str,
) -> dict[str, Any]:
    duration = _duration_s(clip)
    rtf: dict[str, dict[str, list[float]]] = {v: {"stt": [], "tts": []} for v in targets}
    cpu = {"stt": 0.0, "tts": 0.0}
    for n in range(count):
        # A B, then B A: whichever goes second does not always find the machine as the first left it
        order = list(targets.items()) if n % 2 == 0 else list(reversed(targets.items()))
        for lane in ("stt", "tts"):
            for variant, lanes in order:
                cpu0 = cpu_seconds([daemon_pid])
                if lane == "stt":
                    seconds, _text = _hear(client, *lanes["stt"], clip)
                    rtf[variant]["stt"].append(seconds / duration)
                else:
                    seconds, spoken = _speak(client, *lanes["tts"], text)
                    rtf[variant]["tts"].append(seconds / spoken)
                if variant == "gateway":  # summed: the kernel counts CPU in 10 ms ticks
                    cpu[lane] += cpu_seconds([daemon_pid]) - cpu0
    out: dict[str, Any] = {v: {lane: median(xs) for lane, xs in lanes.items()} for v, lanes in rtf.items()}
    for lane in ("stt", "tts"):
        # each request against its neighbour on the other path: drift in the machine's load
        # over a run cancels out of the pairs
        pairs = zip(rtf["gateway"][lane], rtf["direct"][lane], strict=True)
        out[f"{lane}_ratio"] = median(a / b for a, b in pairs)
        out[f"{lane}_daemon_cpu_ms"] = cpu[lane] * 1000 / count
    out["stt_added_ms"] = median(
        (a - b) * duration * 1000 for a, b in zip(rtf["gateway"]["stt"], rtf["direct"]["stt"], strict=True)
    )
    return out


def run(ctx: Context) -> dict[str, Any]:
    count, text = ctx.pick(4, 1), ctx.pick(TEXT, QUICK_TEXT)
    runs: list[dict[str, Any]] = []
    with (
        running_daemon(engine_config(1), tag="speech", speech=True) as daemon,
        httpx.Client(timeout=600) as client,
    ):
        r = client.post(
            f"{daemon.url}/v1/audio/speech", json={"model": TTS, "input": text, "response_format": "wav"}
        )
        r.raise_for_status()
        clip = r.content  # the engines are started by these two first requests
        heard = client.post(
            f"{daemon.url}/v1/audio/transcriptions",
            data={"model": STT},
            files={"file": ("clip.wav", clip, "audio/wav")},
        )
        heard.raise_for_status()
        stt_info, tts_info = engine_of(daemon.url, STT), engine_of(daemon.url, TTS)
        stt_direct = DirectEngine(stt_info.argv, log_dir=ctx.work_dir)
        tts_direct = DirectEngine(tts_info.argv, log_dir=ctx.work_dir)
        with contextlib.ExitStack() as stack:
            for direct in (stt_direct, tts_direct):  # both load at once, then both are waited for
                stack.callback(direct.stop)
                direct.start(wait=False)
            for direct in (stt_direct, tts_direct):
                wait_http(f"{direct.url}/health", timeout_s=180.0, proc=direct.proc)
            targets: dict[str, dict[str, Target]] = {
                "gateway": {"stt": (daemon.url, {}), "tts": (daemon.url, {})},
                "direct": {
                    "stt": (stt_direct.url, {"Authorization": f"Bearer {stt_direct.api_key}"}),
                    "tts": (tts_direct.url, {"Authorization": f"Bearer {tts_direct.api_key}"}),
                },
            }
            if not ctx.quick:  # a quick run measures nothing: its one run is its warm-up
                _one_run(client, targets, clip, 1, daemon.proc.pid, text)  # warm both paths
            for n in range(ctx.runs):
                log(f"speech: run {n + 1}/{ctx.runs}")
                runs.append(_one_run(client, targets, clip, count, daemon.proc.pid, text))
            commands = daemon_commands(engine_config(1)) | {
                "stt engine (the daemon's)": redact(stt_info.argv),
                "stt engine (direct)": redact(stt_direct.argv),
                "tts engine (the daemon's)": redact(tts_info.argv),
                "tts engine (direct)": redact(tts_direct.argv),
            }

    def get(variant: str, lane: str) -> dict[str, Any]:
        return summarize(r[variant][lane] for r in runs)

    def get_ratio(lane: str) -> dict[str, Any]:
        return summarize(r[f"{lane}_ratio"] for r in runs)

    clip_s = _duration_s(clip)
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "stt_model": STT,
            "tts_voice": TTS,
            "clip_s": round(clip_s, 2),
            "text_chars": len(text),
            "requests_per_run": count,
        },
        "values": {
            "stt_rtf_ratio": get_ratio("stt"),
            "tts_rtf_ratio": get_ratio("tts"),
        },
        "tables": [
            {
                "title": f"Real-time factor (processing time ÷ audio duration), median [min, max] over "
                f"{len(runs)} runs of {count} requests per path",
                "columns": ["lane", "gateway", "engine alone", "gateway ÷ engine alone"],
                "rows": [
                    [label, get("gateway", lane), get("direct", lane), get_ratio(lane)]
                    for label, lane in (("STT (whisper tiny.en)", "stt"), ("TTS (piper joe-us, wav)", "tts"))
                ],
            },
            {
                "title": "What the gateway itself spends per request (ms, median [min, max] over runs)",
                "columns": ["lane", "wall time added (A - B, pairs)", "daemon CPU"],
                "rows": [
                    [
                        "STT",
                        summarize(r["stt_added_ms"] for r in runs),
                        summarize(r["stt_daemon_cpu_ms"] for r in runs),
                    ],
                    ["TTS", None, summarize(r["tts_daemon_cpu_ms"] for r in runs)],
                ],
            },
        ],
        "plots": [],
        "commands": commands,
        "raw_runs": runs,
    }
