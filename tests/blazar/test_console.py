"""The console's read model without HTTP: the per-second series ring (fake times), the row
builders, what one viewer sees, the SSE framing and its end, and ``blazar watch``'s view."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from rich.console import Console

from actors.admission import ClassStatistics
from actors.census import Census, Gpu
from actors.engine import EngineStatistics
from actors.federation import PoolWorker, Snapshot
from actors.jobs import JobRecord
from actors.lifecycle import ResidentStatistics
from actors.peer import PeerView
from actors.pool import PoolView, Registration, RouterView
from blazar.auth.keys import FAMILIES, Key
from blazar.cli.watch import render, sparkline
from blazar.telemetry.series import SeriesRing
from blazar.web.console.api import PING, sse_event, stream
from blazar.web.console.model import (
    CardRow,
    Shared,
    class_rows,
    job_results,
    job_row,
    memory_of,
    model_rows,
    peer_rows,
    view_for,
    viewer_of,
)
from registry.gguf import ModelInfo
from registry.store import ModelRecord

T0 = 1_764_600_000.0

# -- the series ring -------------------------------------------------------


def test_points_are_one_per_second_oldest_first_with_zeros_between() -> None:
    ring = SeriesRing(size=5)
    ring.add(T0 + 0.2, ttft_s=0.1, tpot_s=0.01, tokens_in=10, tokens_out=4)
    ring.add(T0 + 0.9, ttft_s=0.3, tokens_out=6)
    ring.add(T0 + 2.5, error=True)
    points = ring.points(T0 + 3.1)
    assert [p["time"] for p in points] == [T0 - 1, T0, T0 + 1, T0 + 2, T0 + 3]
    assert [p["requests_per_s"] for p in points] == [0.0, 2.0, 0.0, 1.0, 0.0]
    assert points[1]["ttft_p50_s"] == pytest.approx(0.2)  # the median of 0.1 and 0.3
    assert points[1]["tpot_p50_s"] == pytest.approx(0.01)
    assert points[1]["tokens_out_per_s"] == 10.0
    assert points[3]["errors_per_s"] == 1.0 and points[3]["ttft_p50_s"] is None
    assert points[0] == {
        "time": T0 - 1,
        "requests_per_s": 0.0,
        "ttft_p50_s": None,
        "tpot_p50_s": None,
        "tokens_out_per_s": 0.0,
        "errors_per_s": 0.0,
    }


def test_a_second_that_left_the_ring_is_forgotten_when_its_bucket_is_reused() -> None:
    ring = SeriesRing(size=3)
    ring.add(T0, tokens_out=5)
    ring.add(T0 + 3, tokens_out=1)  # the same bucket, three seconds later
    assert [p["tokens_out_per_s"] for p in ring.points(T0 + 3)] == [0.0, 0.0, 1.0]
    # Read long after: nothing of the old seconds shows.
    assert all(p["requests_per_s"] == 0.0 for p in ring.points(T0 + 100))


def test_rates_average_the_last_seconds() -> None:
    ring = SeriesRing()
    for i in range(20):
        ring.add(T0 + i, tokens_in=3, tokens_out=2, error=i % 2 == 0)
    rates = ring.rates(T0 + 19.5, window_s=10)
    assert rates == {
        "window_s": 10,
        "requests_per_s": 1.0,
        "errors_per_s": 0.5,
        "tokens_in_per_s": 3.0,
        "tokens_out_per_s": 2.0,
    }
    assert ring.rates(T0 + 100)["requests_per_s"] == 0.0


def test_a_busy_second_keeps_a_bounded_sample_for_its_medians() -> None:
    ring = SeriesRing(size=2)
    for _ in range(10_000):
        ring.add(T0, ttft_s=0.5)
    (point,) = [p for p in ring.points(T0) if p["time"] == T0]
    assert point["requests_per_s"] == 10_000.0 and point["ttft_p50_s"] == 0.5
    assert len(ring._buckets[int(T0) % 2].ttft) <= 256


# -- rows ------------------------------------------------------------------


def _record(name: str, digest: str) -> ModelRecord:
    return ModelRecord(
        name=name, digest=digest, size=1234, path="/m", source="test", created_at=1.0, modified_at=1.0
    )


def _engine(model: str, **over: Any) -> EngineStatistics:
    fields: dict[str, Any] = dict(
        name=f"engine[{model}]",
        running=True,
        handled=1,
        queued=0,
        model=model,
        state="ready",
        engine="llamacpp-host",
        pid=42,
        port=5000,
        slots=4,
        ctx_per_slot=4096,
        ctx_served=None,
        in_flight=1,
        starts=1,
        restarts=0,
        crashes=0,
        generation=1,
        started_at=1.0,
        last_error=None,
        lane="llama.cpp",
        version="xllamacpp 0.2.5",
        breaker="closed",
        breaker_retry_after_s=None,
        stderr_tail="",
    )
    return EngineStatistics(**{**fields, **over})


def test_model_rows_join_the_store_the_engines_and_admission() -> None:
    info = ModelInfo(
        architecture="llama",
        parameter_count=1,
        file_type="Q4_1",
        context_length=8192,
        tensor_count=0,
        data_offset=0,
    )
    resident = ResidentStatistics(
        model="a", loaded=True, in_flight=1, queued=2, keep_alive_s=300, last_used_at=1.0, expires_at=301.0
    )
    rows = model_rows(
        [_record("a", "d1"), _record("b", "d2")],
        {"d1": info, "d2": None},
        [_engine("a"), _engine("gone", state="failed", pid=None, last_error="crashed")],
        queues={"a": (3, 2)},
        residents={"a": resident},
        footprint=lambda m: 500 if m == "a" else None,
        rss={42: 700},
    )
    a, b, gone = rows
    assert a == {
        "name": "a",
        "size_bytes": 1234,
        "quant": "Q4_1",
        "ctx_train": 8192,
        "capabilities": ["completion", "tools"],
        "source": "test",
        "loaded": True,
        "state": "ready",
        "engine": "llamacpp-host",
        "pid": 42,
        "port": 5000,
        "slots": 4,
        "busy": 3,
        "queued": 2,
        "ctx_per_slot": 4096,
        "memory_bytes": 500,
        "rss_bytes": 700,
        "expires_at": 301.0,
        "restarts": 0,
        "last_error": None,
        "lane": "llama.cpp",
        "engine_version": "xllamacpp 0.2.5",
        "breaker": "closed",
        "breaker_retry_after_s": None,
        "stderr_tail": "",
    }
    # installed, never loaded: every engine field is null, none is absent
    assert set(b) == set(a) and b["loaded"] is False and b["quant"] is None
    assert b["state"] is b["pid"] is b["slots"] is b["memory_bytes"] is b["expires_at"] is None
    # an engine whose model left the store is still shown
    assert gone["name"] == "gone" and gone["size_bytes"] is None and gone["last_error"] == "crashed"
    assert gone["loaded"] is False and gone["rss_bytes"] is None


def _job(**over: Any) -> JobRecord:
    fields: dict[str, Any] = dict(
        id="job_1", kind="pull", state="running", model=None, request=b"", created_at=5.0, updated_at=6.0
    )
    return JobRecord(**{**fields, **over})


def test_job_rows_say_how_far_a_job_is() -> None:
    pulling = job_row(_job(), {"status": "downloading", "total": 200, "completed": 50})
    assert pulling == {
        "id": "job_1",
        "kind": "pull",
        "state": "running",
        "progress": 0.25,
        "created_at": 5.0,
        "detail": "downloading",
        "results": [],
    }
    assert job_row(_job(state="completed"))["progress"] == 1.0
    failed = job_row(_job(kind="batch", state="failed", error="bad input", model="m"))
    assert failed["progress"] is None and failed["detail"] == "bad input"
    assert job_row(_job(kind="response", state="queued", model="m"))["detail"] == "m"


def test_an_ended_job_says_where_its_results_are_read() -> None:
    assert job_results(_job(state="completed")) == []  # a pull has none
    assert job_results(_job(id="resp_1", kind="response", state="running")) == []  # not yet
    assert job_results(_job(id="resp_1", kind="response", state="completed")) == [
        {"label": "response", "url": "/v1/responses/resp_1", "filename": "resp_1.json"}
    ]
    assert job_results(_job(id="msgbatch_9", kind="batch", state="cancelled"))[0]["url"] == (
        "/v1/messages/batches/msgbatch_9/results"
    )
    # an OpenAI batch: only the files it wrote
    only_errors = job_results(_job(id="batch_7", kind="batch", state="completed"), {"file-err-7"})
    assert only_errors == [
        {"label": "errors", "url": "/v1/files/file-err-7/content", "filename": "batch_7_errors.jsonl"}
    ]


def test_memory_has_the_ram_the_budget_and_each_gpu() -> None:
    census = Census(
        source="nvml",
        ram_total=100,
        ram_available=60,
        gpus=[Gpu(index=0, name="H200", total=1000, used=100, free=900)],
    )
    assert memory_of(census, 80) == {
        "total_bytes": 100,
        "available_bytes": 60,
        "budget_bytes": 80,
        "gpus": [{"name": "H200", "total_bytes": 1000, "free_bytes": 900}],
    }
    assert memory_of(Census(source="system"), None)["total_bytes"] is None


# -- one viewer --------------------------------------------------------------


def _shared() -> Shared:
    def card(trace_id: str, key: str | None, model: str) -> CardRow:
        return CardRow(key=key, model=model, view={"id": trace_id, "model": model})

    return Shared(
        time=T0,
        models=[{"name": "qwen-small", "stderr_tail": "load"}, {"name": "llama-big", "stderr_tail": "x"}],
        requests=[card("r1", "ci", "qwen-small"), card("r2", "other", "llama-big")],
        recent=[card("r3", None, "qwen-small")],
        rates={},
        series=[],
        quantiles={"qwen-small": {}, "llama-big": {}},
        jobs=[],
        memory={},
        classes=class_rows([_class("interactive", granted=2, waited_s=0.5), _class("batch", preempted=1)]),
    )


def _class(name: str, **counts: Any) -> ClassStatistics:
    fields = {"queued": 0, "running": 0, "granted": 0, "waited_s": 0.0, "rejected": 0, "expired": 0}
    return ClassStatistics(name=name, **(fields | {"preempted": 0} | counts))


WORKER = "http://127.0.0.1:8081"


def test_peer_rows_join_a_router_s_workers_and_the_pool_entry() -> None:
    router = PeerView(
        name="replicas", remote="replicas", url="http://127.0.0.1:30001", state="up", pool="smg",
        kind="openai", snapshot_age_s=0.5, last_error=None, failures=0,
        snapshot=Snapshot(kind="openai", workers=[PoolWorker(url=WORKER, model="m", healthy=True)]),
    )  # fmt: skip
    plain = msgspec.structs.replace(router, name="b", remote="b", pool=None, snapshot=None, state="down")
    started = RouterView(state="ready", url=router.url, pid=42, restarts=0, last_error=None)
    entry = PoolView(
        name="replicas", router="smg", models=["m"], started=started,
        registrations=[Registration(worker="m", url="http://127.0.0.1:8081", state="registered", id="w1")],
    )  # fmt: skip
    shown, down = peer_rows([router, plain], [entry])
    assert shown["workers"][0]["healthy"] is True and shown["router"]["pid"] == 42
    assert shown["registrations"][0]["state"] == "registered" and shown["state"] == "up"
    assert down["workers"] is None and down["router"] is None and down["registrations"] == []
    assert down["state"] == "down" and down["loaded"] == []


def test_class_rows_give_each_class_its_queue_waits_and_preemptions() -> None:
    interactive, batch = _shared().classes
    assert interactive == {
        "name": "interactive",
        "queued": 0,
        "running": 0,
        "granted": 2,
        "mean_wait_ms": 250.0,
        "rejected": 0,
        "expired": 0,
        "preempted": 0,
    }
    assert batch["mean_wait_ms"] is None and batch["preempted"] == 1


def _key(name: str, families: tuple[str, ...], models: tuple[str, ...] = ("*",)) -> Key:
    return Key(name=name, digest="", hint="", families=families, models=models, created_at=0.0)


def test_without_keys_the_viewer_sees_everything() -> None:
    doc = view_for(_shared(), key=None, grant=None)
    assert doc["viewer"] == {"key": None, "admin": True, "scopes": list(FAMILIES)}
    assert [r["id"] for r in doc["requests"]] == ["r1", "r2"] and len(doc["models"]) == 2
    assert list(doc) == [
        "time",
        "version",
        "viewer",
        "models",
        "requests",
        "recent",
        "rates",
        "series",
        "quantiles",
        "jobs",
        "memory",
        "classes",
        "peers",
    ]
    assert [c["name"] for c in doc["classes"]] == ["interactive", "batch"]


def test_a_metrics_key_sees_its_own_requests_and_its_models() -> None:
    grant = _key("ci", ("metrics",), ("qwen*",))
    doc = view_for(_shared(), key="ci", grant=grant)
    assert doc["viewer"] == {"key": "ci", "admin": False, "scopes": ["metrics"]}
    assert [r["id"] for r in doc["requests"]] == ["r1"] and doc["recent"] == []
    assert doc["models"] == [{"name": "qwen-small", "stderr_tail": None}]  # an engine's stderr: admin only
    assert list(doc["quantiles"]) == ["qwen-small"]
    assert doc["classes"] == [] and doc["peers"] == []  # every model's figures, the peers: admin only


def test_an_admin_key_sees_every_request() -> None:
    doc = view_for(_shared(), key="boss", grant=_key("boss", ("admin",)))
    assert doc["viewer"]["admin"] is True
    assert [r["id"] for r in doc["requests"]] == ["r1", "r2"] and len(doc["recent"]) == 1
    assert [m["stderr_tail"] for m in doc["models"]] == ["load", "x"]
    assert viewer_of("local", _key("local", FAMILIES))["admin"] is True


# -- the stream ----------------------------------------------------------------


class _Hub:
    def __init__(self) -> None:
        self.built = 0
        self.shared_now = _shared()

    async def shared(self) -> Shared:
        self.built += 1
        return self.shared_now


def _decode(chunk: bytes) -> dict[str, Any]:
    head, data, end = chunk.split(b"\n", 2)
    assert head == b"event: snapshot" and data.startswith(b"data: ") and end == b"\n"
    doc: dict[str, Any] = msgspec.json.decode(data[6:])
    return doc


async def test_the_stream_sends_a_snapshot_then_pings_while_nothing_changes_and_ends_on_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub, stopping = _Hub(), trio.Event()
    chunks: list[bytes] = []
    gen = stream(hub, key=None, grant=None, interval_s=1.0, stopping=stopping)  # type: ignore[arg-type]
    chunks.append(await gen.__anext__())
    chunks.append(await gen.__anext__())  # nothing changed
    hub.shared_now = Shared(**_changed())
    chunks.append(await gen.__anext__())
    assert _decode(chunks[0])["time"] == T0
    assert chunks[1] == PING
    assert _decode(chunks[2])["models"] == [{"name": "changed"}]
    t = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_after, stopping, 0.1)
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
    assert trio.current_time() - t < 1.0  # woke by the shutdown, not the next tick
    assert hub.built == 3


def _changed() -> dict[str, Any]:
    s = _shared()
    return {**{f: getattr(s, f) for f in s.__dataclass_fields__}, "models": [{"name": "changed"}]}


async def _set_after(event: trio.Event, delay: float) -> None:
    await trio.sleep(delay)
    event.set()


def test_an_event_is_one_data_line() -> None:
    chunk = sse_event({"text": "two\nlines"})
    assert chunk.count(b"\n") == 3 and chunk.endswith(b"\n\n")


# -- blazar watch's view ------------------------------------------------------


def _snapshot(models: int, requests: int) -> dict[str, Any]:
    return {
        "time": T0,
        "version": "0.1.0",
        "models": [
            {
                "name": f"model-{i}",
                "loaded": i == 0,
                "state": "ready" if i == 0 else None,
                "slots": 4 if i == 0 else None,
                "busy": 1,
                "queued": 0,
                "memory_bytes": 5 * 10**8 if i == 0 else None,
                "rss_bytes": None,
                "expires_at": T0 + 90 if i == 0 else None,
            }
            for i in range(models)
        ],
        "requests": [
            {
                "id": f"blz-1-{i}",
                "path": "/v1/messages",
                "model": "model-0",
                "state": "queued",
                "queue_position": i,
                "class": "batch",
                "preempted": 2 if i == 0 else 0,
                "chunks": 0,
                "ttft_ms": None,
                "elapsed_ms": 1500.0,
            }
            for i in range(requests)
        ],
        "rates": {"window_s": 10, "requests_per_s": 2.5},
        "series": [{"requests_per_s": float(i % 5)} for i in range(300)],
        "quantiles": {"model-0": {"warm": {"count": 2, "ttft_ms": {"p50": 120.0, "p95": 1500.0}}}},
        "jobs": [{"id": "job_1", "kind": "pull", "state": "running", "progress": 0.5, "detail": None}],
        "memory": {"total_bytes": 2 * 10**9, "available_bytes": 10**9, "budget_bytes": None, "gpus": []},
    }


def _screen(doc: dict[str, Any], width: int = 80, height: int = 24) -> list[str]:
    console = Console(width=width, height=height, record=True, color_system=None)
    with console.capture() as cap:
        console.print(render(doc, width=width, height=height, url="http://127.0.0.1:11435"))
    return cap.get().rstrip("\n").split("\n")


def test_the_view_fits_80x24_however_much_there_is() -> None:
    lines = _screen(_snapshot(models=30, requests=40))
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "model-0" in text and "ready" in text and "1/4" in text and "1m30s" in text
    assert "more" in text  # the cut tables say how much is left out
    assert "anthropic" in text and "queued #" in text and "50%" in text and "120ms" in text
    assert text.isascii()


def test_the_view_shows_the_classes_that_saw_requests() -> None:
    doc = _snapshot(models=1, requests=1)
    doc["classes"] = class_rows(
        [_class("interactive"), _class("batch", running=1, granted=3, waited_s=3.0, preempted=2)]
    )
    text = "\n".join(_screen(doc, width=100, height=40))
    assert "Classes (1)" in text and "batch x2" in text
    row = next(line for line in text.splitlines() if line.startswith("batch "))
    assert row.split() == ["batch", "0", "1", "3", "1.00s", "0", "0", "2"]


def test_the_view_shows_a_line_for_an_empty_section() -> None:
    doc = _snapshot(models=1, requests=0)
    doc["jobs"] = []
    text = "\n".join(_screen(doc))
    assert "Requests (0)" in text and "none" in text and "more" not in text


def test_sparkline_scales_to_the_largest_value() -> None:
    assert sparkline([0, 1, 2, 4], 4) == " :=@"
    assert sparkline([0, 0], 2) == "  " and sparkline([5], 0) == ""
    assert sparkline([0.01, 100], 2)[0] != " "  # a little is not nothing


async def test_subscribers_share_one_snapshot_per_tick(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blazar.web.console import api

    builds: list[float] = []

    async def fake_gather(*_: object) -> Shared:
        builds.append(trio.current_time())
        await trio.sleep(0.05)  # the worker thread's reads
        return Shared(**{**_changed(), "built_s": trio.current_time()})

    monkeypatch.setattr(api, "gather", fake_gather)
    hub = api.ConsoleHub(None, None, None)  # type: ignore[arg-type]
    got: list[Shared] = []

    async def subscriber() -> None:
        got.append(await hub.shared())

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(subscriber)
    assert len(builds) == 1 and all(s is got[0] for s in got)
    await trio.sleep(1.0)
    await hub.shared()
    assert len(builds) == 2 and hub.builds == 2
