"""Pool entries of ``[[remotes]]`` (a router over replicas): what the config accepts, which
pool a model goes to, the router's command line, and its worker list read as a snapshot."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.config import Remote, Tunables
from actors.federation import SnapshotError, parse_workers, pool_snapshot
from actors.pool import Pools, router_argv

SMG_WORKERS = b"""{"workers":[
 {"id":"w2","model_id":"m","url":"http://127.0.0.1:9002","models":[{"id":"m"}],"is_healthy":false,
  "status":"ready","load":0},
 {"id":"w1","url":"http://127.0.0.1:9001","models":[{"id":"m"}],"is_healthy":true,"status":"ready",
  "load":2, "runtime_type":"generic"}],
 "total":2}"""


def test_a_started_pool_needs_no_url_and_serves_its_local_workers() -> None:
    r = Remote(name="p", pool="smg", start=True, workers=["smollm2-135m", "http://10.0.0.5:8080"])
    assert r.local_workers() == ["smollm2-135m"]
    assert r.pool_models() == ["smollm2-135m"]
    assert Remote(name="p", pool="smg", url="http://r:30000", model="m").pool_models() == ["m"]
    assert Remote(name="plain", url="http://r:8000").pool_models() == []


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"start": True}, "only for a pool router"),
        ({"url": "http://x", "workers": ["m"]}, "only for a pool router"),
        ({"pool": "smg", "start": True, "url": "http://x"}, "drop url and dns"),
        ({"pool": "smg", "start": True, "key": "k"}, "without key or TLS"),
        ({"pool": "smg", "url": "http://x", "policy": "random"}, "only for a router started here"),
        ({"pool": "smg", "dns": "r.lan", "port": 1}, "one url, not a dns name"),
        ({"pool": "smg"}, "exactly one of url or dns"),
        ({"pool": "smg", "start": True, "workers": ["m", "m"]}, "more than once"),
    ],
)
def test_a_wrong_pool_entry_is_refused_saying_why(entry: dict[str, object], says: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=says):
        msgspec.convert({"remotes": [{"name": "p", **entry}]}, Tunables)


def test_a_model_goes_to_the_pool_that_serves_it(tmp_path: Path) -> None:
    pools = Pools(
        [
            Remote(name="plain", url="http://r:8000"),
            Remote(name="p", pool="smg", start=True, workers=["m:latest", "http://10.0.0.5:8080"]),
        ],
        run_dir=tmp_path,
        grace_s=1.0,
    )
    assert bool(pools) and list(pools.started) == ["p"]
    assert pools.serving("m") is not None and pools.serving("m:latest") is not None
    assert pools.serving("other") is None
    url, control = pools.started["p"]
    assert url.startswith("http://127.0.0.1:") and control["Authorization"].startswith("Bearer ")


def test_the_router_runs_on_loopback_under_the_watchdog_with_a_control_key() -> None:
    r = Remote(
        name="p", pool="smg", start=True, policy="round_robin", router_args=["--retry-max-retries", "2"]
    )
    argv = router_argv(r, "/opt/smg", port=30001, metrics_port=30002, control_key="k")
    assert argv[1:4] == ["-m", "actors.engines.watchdog", "/opt/smg"]
    flags = " ".join(argv[4:])
    assert "launch --host 127.0.0.1 --port 30001" in flags
    assert "--prometheus-host 127.0.0.1 --prometheus-port 30002" in flags
    assert "--control-plane-api-keys blazar:blazar:admin:k" in flags
    assert "--policy round_robin" in flags and flags.endswith("--retry-max-retries 2")


def test_the_routers_worker_list_is_the_pools_snapshot() -> None:
    workers = parse_workers(SMG_WORKERS)
    assert [(w.url, w.id, w.model, w.healthy, w.load) for w in workers] == [
        ("http://127.0.0.1:9001", "w1", "m", True, 2),
        ("http://127.0.0.1:9002", "w2", "m", False, 0),
    ]
    snap = pool_snapshot(workers)
    assert snap.kind == "openai" and snap.has("m") and snap.workers == workers
    with pytest.raises(SnapshotError):
        parse_workers(b'{"data": []}')
