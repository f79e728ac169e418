"""``Runtime.claim`` without the HTTP layer: failover chains walked by name, and the refusals
made before anything loads (a prompt too long for the context, a certificate's FAIL).

The engines are the benchmarks' instant upstream, spawned as llama-server would be.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from actors import RuntimeConfig, open_runtime
from actors.certificates import Certificate, Probe
from actors.chain_walk import FailoverExhausted
from actors.config import EngineConfig, FailoverChain, ModelOverride
from actors.engine import EngineState
from actors.preflight import CapabilityFailed, PromptTooLong
from tests.instant import SHIM
from tests.support import MODEL, install_damaged_copy


@dataclass(frozen=True)
class _Text:
    """A prompt of ``n`` bytes of text in one turn (a ``PromptBound``)."""

    n: int
    turns: int = 1

    def token_floor(self, *, token_bytes_max: int | None, message_tokens: int = 0) -> int:
        return -(-self.n // token_bytes_max) if token_bytes_max else 0


def _config(home: Path, **settings: object) -> RuntimeConfig:
    engine = EngineConfig(llama_server=str(SHIM), start_timeout_s=20.0)
    return RuntimeConfig.in_home(str(home), engine=engine, default_ctx=512, keep_alive_s=-1, **settings)


async def test_a_chain_is_claimed_by_name_and_walked_past_a_target_that_cannot_serve(home: Path) -> None:
    chain = FailoverChain(name="assistant", targets=["not-installed", MODEL])
    async with open_runtime(_config(home, failover=[chain])) as rt:
        async with rt.claim("assistant", client="embedder") as claim:
            assert claim.model == MODEL
            assert claim.walk is not None and claim.walk.target == MODEL
            [(target, code, _why)] = claim.walk.passed
            assert (target, code) == ("not-installed", "MODEL_NOT_FOUND")
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            resp = await claim.handle.client.post("/v1/chat/completions", json=chat)
            assert resp.status_code == 200
        # The target that failed is benched: the next walk passes it over without trying it.
        async with rt.claim("assistant") as again:
            assert again.walk is not None and again.walk.passed[0][1] == "skipped"
        assert rt.failover.state("assistant", "not-installed").failures == 1
        assert rt.failover.state("assistant", MODEL).served == 2


async def test_a_target_whose_file_cannot_be_read_is_passed_over(home: Path, model_path: Path) -> None:
    install_damaged_copy(home, "cut-short", model_path, keep=4096)  # inside the GGUF header
    chain = FailoverChain(name="assistant", targets=["cut-short", MODEL])
    async with open_runtime(_config(home, failover=[chain])) as rt:
        async with rt.claim("assistant") as claim:
            assert claim.walk is not None and claim.walk.target == MODEL
            [(target, code, _why)] = claim.walk.passed
            assert target == "cut-short" and code != "skipped"


async def test_a_chain_with_no_target_left_is_exhausted(home: Path) -> None:
    chain = FailoverChain(name="nowhere", targets=["missing-a", "missing-b"])
    async with open_runtime(_config(home, failover=[chain])) as rt:
        with pytest.raises(FailoverExhausted) as caught:
            await rt.claim("nowhere")
        assert caught.value.code == "FAILOVER_EXHAUSTED"
        assert "missing-a: MODEL_NOT_FOUND" in caught.value.message
        assert "missing-b: MODEL_NOT_FOUND" in caught.value.message


async def test_a_prompt_longer_than_the_context_is_refused_before_the_engine_starts(home: Path) -> None:
    async with open_runtime(_config(home)) as rt:
        engine = await rt.engine_for(MODEL)
        assert engine.spec.token_bytes_max, "the test model's vocabulary gives the bytes per token"
        with pytest.raises(PromptTooLong) as caught:
            await rt.claim(MODEL, prompt=_Text(n=600 * engine.spec.token_bytes_max))
        assert caught.value.code == "PROMPT_TOO_LONG" and caught.value.ctx == 512
        assert engine.state is EngineState.STOPPED  # nothing was started to find that out
        assert all(q.running == q.queued == 0 for q in rt.admission.statistics().queues)
        # The same prompt fits once the claim asks for a context that holds it.
        async with rt.claim(MODEL, prompt=_Text(n=600 * engine.spec.token_bytes_max), ctx_per_slot=1024):
            assert (engine.served_ctx or engine.spec.ctx_per_slot) >= 1024


async def test_a_capability_the_certificate_fails_is_refused_before_the_engine_starts(home: Path) -> None:
    failed = Probe(capability="tools", status="FAIL", detail="no tool call", answer="plain text")
    cert = Certificate(model=MODEL, engine="llamacpp", created_at=time.time(), probes=[failed])
    config = _config(home, models={MODEL: ModelOverride()})
    async with open_runtime(config) as rt:
        rt.certificates.put(cert)
        engine = await rt.engine_for(MODEL)
        with pytest.raises(CapabilityFailed) as caught:
            await rt.claim(MODEL, needs=["tools"])
        assert "tools" in caught.value.message and engine.state is EngineState.STOPPED
        async with rt.claim(MODEL, needs=["tools"], certifying=True):  # the doctor's own probe
            pass
