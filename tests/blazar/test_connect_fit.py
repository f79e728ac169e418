"""Whether a tool's first real turn fits the context the daemon gives a model (the 16-token test
request passes on any), the ``ctx`` to set, whether the model's training allows it, and the
output cap for the tools that send none."""

from __future__ import annotations

from blazar.connect import find_tool
from blazar.connect.fit import (
    ANSWER_ROOM,
    Candidate,
    check_fit,
    ctx_refusal,
    model_context,
    output_cap_edit,
    suggested_ctx,
)

SMOLLM2 = model_context("smollm2-135m", trained=8192, default_ctx=4096)
CANDIDATES = [
    Candidate(name="qwen3-0.6b", trained=40960, installed=False, tools=True, size=639_000_000),
    Candidate(name="smollm2-360m", trained=8192, installed=False, size=386_000_000),
    Candidate(name="gemma3-1b", trained=32768, installed=False, size=800_000_000),
    Candidate(name="big-local", trained=131072, installed=True, size=9_000_000_000),
]


def test_each_tool_carries_its_first_turn_and_whether_it_sends_a_cap() -> None:
    sizes = {
        name: find_tool(name).first_turn_tokens for name in ("claude", "opencode", "codex", "aider", "llm")
    }
    assert sizes == {"claude": 19_000, "opencode": 7_240, "codex": 6_280, "aider": 670, "llm": 50}
    # aider (litellm) and llm send no output limit: connect caps them; the agents send their own
    # (Claude Code) or fail on a capped answer (Codex).
    assert find_tool("aider").output_cap and find_tool("llm").output_cap
    assert find_tool("claude").output_cap is None and find_tool("codex").output_cap is None
    assert find_tool("cline").first_turn_tokens is None  # never measured: no warning either way


def test_the_context_is_the_daemons_rule() -> None:
    assert SMOLLM2.ctx == 4096 and not SMOLLM2.configured  # min(training 8192, default_ctx 4096)
    assert model_context("m", trained=2048, default_ctx=4096).ctx == 2048  # the training context wins
    assert model_context("m", trained=None, default_ctx=8192).ctx == 4096  # the fallback training context
    set_ = model_context("m", trained=8192, default_ctx=4096, ctx=8192)
    assert set_.ctx == 8192 and set_.configured
    # Above the training context the daemon clamps, unless rope scaling extends the model.
    assert model_context("m", trained=8192, default_ctx=4096, ctx=32768).ctx == 8192
    yarn = model_context("m", trained=8192, default_ctx=4096, ctx=32768, rope_scaling="yarn")
    assert yarn.ctx == 32768 and yarn.extended
    scaled = model_context(
        "m", trained=8192, default_ctx=4096, ctx=32768, rope_scaling="yarn", rope_scale=2.0
    )
    assert scaled.ctx == 16384


def test_claude_code_on_smollm2_is_warned_with_the_ctx_and_models_trained_for_it() -> None:
    fit = check_fit("Claude Code", 19_000, SMOLLM2, CANDIDATES, command="blazar connect claude")
    assert fit is not None and not fit.fits
    assert (fit.need, fit.ctx, fit.suggest_ctx, fit.trained) == (19_000 + ANSWER_ROOM, 4096, 32768, 8192)
    assert fit.training_allows is False
    # Installed first, then native tools, then the smaller; those trained for less are left out.
    assert fit.alternatives == ["big-local (131,072)", "qwen3-0.6b (40,960)", "gemma3-1b (32,768)"]
    text = "\n".join(fit.lines)
    assert "about 19,000 tokens" in text and "4,096 per slot" in text
    assert 'ctx = 32768 under [models."smollm2-135m"]' in text
    assert "`blazar connect claude --ctx 32768 --write`" in text
    assert 'rope_scaling = "yarn"' in text and "quality degrades" in text
    assert "installed or in the catalog" in text


def test_codex_fits_smollm2_once_its_ctx_is_raised_within_training() -> None:
    fit = check_fit("Codex CLI", 6_280, SMOLLM2, CANDIDATES)
    assert fit is not None and not fit.fits and fit.suggest_ctx == 8192 and fit.training_allows
    assert fit.alternatives == [] and "trained for 8,192 tokens: that ctx is within it" in fit.lines[-1]
    raised = model_context("smollm2-135m", trained=8192, default_ctx=4096, ctx=8192)
    done = check_fit("Codex CLI", 6_280, raised, CANDIDATES)
    assert done is not None and done.fits and done.lines == []
    # opencode's 7,240 and an answer do not fit 8,192: the next step is 16,384, past SmolLM2's training.
    tight = check_fit("opencode", 7_240, raised, CANDIDATES)
    assert (
        tight is not None and not tight.fits and tight.suggest_ctx == 16384 and tight.training_allows is False
    )


def test_small_turns_fit_the_default_and_unmeasured_tools_are_not_judged() -> None:
    aider = check_fit("aider", 670, SMOLLM2)
    assert aider is not None and aider.fits
    assert check_fit("Cline", None, SMOLLM2) is None


def test_the_suggestion_stays_within_a_training_context_that_is_enough() -> None:
    odd = model_context("odd", trained=24576, default_ctx=4096)
    fit = check_fit("Claude Code", 19_000, odd)
    assert fit is not None and fit.suggest_ctx == 24576 and fit.training_allows
    assert [suggested_ctx(n) for n in (100, 4096, 4097, 20_024)] == [4096, 4096, 8192, 32768]


def test_an_extended_or_unknown_model_is_advised_accordingly() -> None:
    yarn = model_context("m", trained=8192, default_ctx=4096, rope_scaling="yarn")
    fit = check_fit("Claude Code", 19_000, yarn, CANDIDATES)
    assert fit is not None and fit.training_allows is True and fit.alternatives == []
    assert "extended with rope_scaling" in fit.lines[-1]
    short = model_context("m", trained=8192, default_ctx=4096, rope_scaling="yarn", rope_scale=2.0)
    fit = check_fit("Claude Code", 19_000, short, CANDIDATES)
    assert fit is not None and fit.training_allows is False and "raise its rope_scale" in fit.lines[-1]
    unknown = model_context("m", trained=None, default_ctx=4096)
    fit = check_fit("Claude Code", 19_000, unknown, CANDIDATES)
    assert fit is not None and fit.training_allows is None and "does not say" in fit.lines[-1]


def test_ctx_above_the_training_context_is_refused_without_rope_scaling() -> None:
    refusal = ctx_refusal(SMOLLM2, 32768)
    assert refusal is not None and "8192-token context smollm2-135m was trained for" in refusal
    assert "rope_scaling" in refusal
    assert ctx_refusal(SMOLLM2, 8192) is None
    assert ctx_refusal(model_context("m", trained=8192, default_ctx=4096, rope_scaling="yarn"), 32768) is None
    scaled = model_context("m", trained=8192, default_ctx=4096, rope_scaling="yarn", rope_scale=2.0)
    assert ctx_refusal(scaled, 16384) is None
    assert "raise rope_scale" in (ctx_refusal(scaled, 32768) or "")
    assert ctx_refusal(model_context("m", trained=None, default_ctx=4096), 65536) is None  # unknown: allowed


def test_the_output_cap_is_set_only_where_neither_tool_nor_user_set_one() -> None:
    assert output_cap_edit("claude", None, "m", model_cap=None, top_cap_set=False) == (None, None)
    cap, line = output_cap_edit("aider", 2048, "m", model_cap=None, top_cap_set=False)
    assert cap == 2048 and line is not None and 'max_output_tokens = 2048 under [models."m"]' in line
    cap, line = output_cap_edit("aider", 2048, "m", model_cap=0, top_cap_set=False)
    assert cap is None and line is not None and "0 (no cap) is kept" in line
    cap, line = output_cap_edit("aider", 2048, "m", model_cap=None, top_cap_set=True)
    assert cap is None and line is not None and "top-level max_output_tokens applies" in line
