"""``blazar connect``'s plans against a temporary home holding the user's own configs (their
comments must survive), the write with its backup and rollback, ``disconnect``, and ``launch``'s
environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from blazar.connect import TOOLS, ModelChoice, choose_models, context, find_tool, plan_for
from blazar.connect._plan import ConnectError, Probe
from blazar.connect.apply import ProbeFailed, backup_path, check_answer, restore, rollback, write_plan
from blazar.connect.launch import launch_env
from tests.support import make_home, unreachable_url
from tests.tomlkit_versions import Scenario

BASE = "http://127.0.0.1:11435"
MODELS = ("qwen-tools", "smollm2-135m")


def ctx(home: Path, key: str | None = None, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return context(home=home, env=env or {}, base_url=BASE, key=key, models=MODELS)


def put(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return text


def yaml_load(text: str):  # type: ignore[no-untyped-def]
    return YAML(typ="safe").load(text)


def blazar(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLAZAR_", "CODEX_", "XDG_", "LLM_"))}
    env |= {"HOME": str(home), "BLAZAR_HOME": str(home / "blazar")}
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_codex_plan_keeps_the_users_toml(tmp_path: Path) -> None:
    old = put(
        tmp_path / ".codex" / "config.toml",
        (
            '# my codex settings\napproval_policy = "on-request"  # keep asking\n\n'
            '[mcp_servers.docs]\ncommand = "docs-mcp"\n'
        ),
    )
    plan = plan_for(find_tool("codex"), ctx(tmp_path))
    assert plan.path == tmp_path / ".codex" / "config.toml" and plan.old_text == old
    assert plan.new_text is not None
    assert "# my codex settings" in plan.new_text and "# keep asking" in plan.new_text
    doc = tomllib.loads(plan.new_text)
    assert doc["model"] == "qwen-tools" and doc["model_provider"] == "blazar"
    assert doc["web_search"] == "disabled" and doc["features"]["multi_agent"] is False
    assert doc["model_providers"]["blazar"] == {
        "name": "Blazar",
        "base_url": f"{BASE}/v1",
        "wire_api": "responses",
    }
    assert doc["mcp_servers"]["docs"]["command"] == "docs-mcp"
    (probe,) = plan.probes
    assert (probe.method, probe.path, probe.answer) == ("POST", "/v1/responses", "sse-responses")
    assert probe.body is not None and probe.body["stream"] is True and probe.body["store"] is False
    # A key given by the user is named through the environment, never written into the file.
    keyed = plan_for(find_tool("codex"), ctx(tmp_path, key="sk-secret"))
    assert keyed.new_text is not None and "sk-secret" not in keyed.new_text
    assert tomllib.loads(keyed.new_text)["model_providers"]["blazar"]["env_key"] == "BLAZAR_API_KEY"
    # CODEX_HOME moves the file, as it moves Codex's.
    moved = plan_for(find_tool("codex"), ctx(tmp_path, env={"CODEX_HOME": str(tmp_path / "ch")}))
    assert moved.path == tmp_path / "ch" / "config.toml" and moved.old_text is None


CODEX_USER = """\
# my codex settings
model = 'o3'  # the default
approval_policy = 'on-request'  # keep asking

# docs, served locally
[mcp_servers.docs]
command = 'docs-mcp'

[features]
# web search off
web_search_request = false
"""


def codex_connect_twice(home: Path) -> list[str]:
    """A scenario (tests.tomlkit_versions): connect, then connect again with another model."""
    path = home / ".codex" / "config.toml"
    put(path, CODEX_USER)
    texts: list[str] = []
    for models in (MODELS, ("other",)):
        plan = plan_for(
            find_tool("codex"), context(home=home, env={}, base_url=BASE, key=None, models=models)
        )
        assert plan.new_text is not None
        path.write_text(plan.new_text)
        texts.append(plan.new_text)
    return texts


def test_codex_plan_keeps_the_users_text_and_quotes(on_tomlkit: Callable[[Scenario], Any]) -> None:
    """The same text on every tomlkit version allowed. The rule for quotes: what blazar writes
    is double-quoted, also where it replaces the user's single-quoted `model`; every line it does
    not write keeps its quotes and comment, and its new top-level keys go after the user's last
    one (the comment above `[mcp_servers.docs]` stays there)."""
    first, second = on_tomlkit(codex_connect_twice)
    assert first == (
        "# my codex settings\n"
        'model = "qwen-tools"  # the default\n'
        "approval_policy = 'on-request'  # keep asking\n"
        'model_provider = "blazar"\n'
        'web_search = "disabled"\n'
        "\n"
        "# docs, served locally\n"
        "[mcp_servers.docs]\n"
        "command = 'docs-mcp'\n"
        "\n"
        "[features]\n"
        "# web search off\n"
        "web_search_request = false\n"
        "multi_agent = false\n"
        "\n"
        "[model_providers.blazar]\n"
        'name = "Blazar"\n'
        f'base_url = "{BASE}/v1"\n'
        'wire_api = "responses"\n'
    )
    assert second == first.replace('"qwen-tools"', '"other"')


def test_claude_plan_merges_the_env_block(tmp_path: Path) -> None:
    put(
        tmp_path / ".claude" / "settings.json",
        json.dumps({"permissions": {"allow": ["Bash(ls)"]}, "env": {"FOO": "1", "ANTHROPIC_API_KEY": "x"}}),
    )
    plan = plan_for(find_tool("claude-code"), ctx(tmp_path))
    assert plan.new_text is not None
    doc = json.loads(plan.new_text)
    assert doc["permissions"] == {"allow": ["Bash(ls)"]}
    env = doc["env"]
    assert env["FOO"] == "1" and "ANTHROPIC_API_KEY" not in env
    assert env["ANTHROPIC_BASE_URL"] == BASE and env["ANTHROPIC_AUTH_TOKEN"] == "local"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "qwen-tools"
    (probe,) = plan.probes
    assert probe.path == "/v1/messages?beta=true" and probe.headers["anthropic-version"] == "2023-06-01"
    assert probe.headers["authorization"] == "Bearer local"


def test_json_with_comments_is_refused_not_rewritten(tmp_path: Path) -> None:
    put(tmp_path / ".config" / "opencode" / "opencode.json", '{\n  // my theme\n  "theme": "dark",\n}\n')
    with pytest.raises(ConnectError, match="not plain JSON"):
        plan_for(find_tool("opencode"), ctx(tmp_path))


def test_opencode_plan_adds_a_provider(tmp_path: Path) -> None:
    put(tmp_path / ".config" / "opencode" / "opencode.json", json.dumps({"theme": "dark", "model": "x/y"}))
    plan = plan_for(find_tool("opencode"), ctx(tmp_path, key="k1"))
    assert plan.new_text is not None
    doc = json.loads(plan.new_text)
    assert doc["theme"] == "dark" and doc["model"] == "x/y"  # the user's default model is kept
    provider = doc["provider"]["blazar"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": f"{BASE}/v1", "apiKey": "k1"}
    assert list(provider["models"]) == list(MODELS)
    assert plan.probes[0].path == "/v1/chat/completions" and plan.probes[0].answer == "sse-chat"
    fresh = plan_for(find_tool("opencode"), ctx(tmp_path / "other"))
    assert fresh.new_text is not None and json.loads(fresh.new_text)["model"] == "blazar/qwen-tools"


def test_continue_plan_keeps_comments_and_replaces_its_own_entries(tmp_path: Path) -> None:
    put(
        tmp_path / ".continue" / "config.yaml",
        "name: Mine  # my config\nversion: 1.0.0\nschema: v1\nmodels:\n  # the cloud one\n"
        "  - name: Cloud\n    provider: anthropic\n    model: claude-x\n",
    )
    tool = find_tool("continue")
    plan = plan_for(tool, ctx(tmp_path))
    assert plan.new_text is not None
    assert "# my config" in plan.new_text and "# the cloud one" in plan.new_text
    models = yaml_load(plan.new_text)["models"]
    assert [m["name"] for m in models] == ["Cloud", "qwen-tools (Blazar)", "smollm2-135m (Blazar)"]
    assert models[1] | {} == {
        "name": "qwen-tools (Blazar)",
        "provider": "openai",
        "model": "qwen-tools",
        "apiBase": f"{BASE}/v1",
        "apiKey": "local",
        "roles": ["chat", "edit", "apply"],
    }
    # Connecting again replaces the entries for this daemon instead of adding more.
    again = tool.plan(ctx(tmp_path), plan.new_text)
    assert again.new_text == plan.new_text and not again.writes


def test_aider_plan_uses_the_verified_ollama_route(tmp_path: Path) -> None:
    put(tmp_path / ".aider.conf.yml", "# aider settings\ndark-mode: true\nset-env:\n  - FOO=bar\n")
    plan = plan_for(find_tool("aider"), ctx(tmp_path))
    assert plan.new_text is not None and "# aider settings" in plan.new_text
    doc = yaml_load(plan.new_text)
    assert doc["dark-mode"] is True and doc["model"] == "ollama_chat/qwen-tools"
    assert doc["set-env"] == ["FOO=bar", f"OLLAMA_API_BASE={BASE}"]
    assert [p.path for p in plan.probes] == ["/api/show", "/api/chat"]
    keyed = plan_for(find_tool("aider"), ctx(tmp_path, key="k2"))
    assert keyed.new_text is not None
    doc = yaml_load(keyed.new_text)
    assert (doc["model"], doc["openai-api-base"], doc["openai-api-key"]) == (
        "openai/qwen-tools",
        f"{BASE}/v1",
        "k2",
    )
    assert doc["set-env"] == ["FOO=bar"]


def test_llm_plan_writes_extra_openai_models(tmp_path: Path) -> None:
    user = tmp_path / "llm-user"
    put(user / "extra-openai-models.yaml", "# my proxy\n- model_id: proxy-gpt\n  model_name: gpt-x\n")
    plan = plan_for(find_tool("llm"), ctx(tmp_path, env={"LLM_USER_PATH": str(user)}))
    assert plan.path == user / "extra-openai-models.yaml"
    assert plan.new_text is not None and "# my proxy" in plan.new_text
    entries = yaml_load(plan.new_text)
    assert [e["model_id"] for e in entries] == ["proxy-gpt", "blazar/qwen-tools", "blazar/smollm2-135m"]
    assert entries[1]["api_base"] == f"{BASE}/v1" and "api_key_name" not in entries[1]
    default = plan_for(find_tool("llm"), ctx(tmp_path))
    assert default.path == tmp_path / ".config" / "io.datasette.llm" / "extra-openai-models.yaml"


def test_tools_without_a_file_print_settings(tmp_path: Path) -> None:
    cline = plan_for(find_tool("cline"), ctx(tmp_path))
    assert cline.path is None and not cline.writes
    assert any("OpenAI Compatible" in line for line in cline.summary)
    webui = plan_for(find_tool("open-webui"), ctx(tmp_path))
    assert any(f"OPENAI_API_BASE_URL={BASE}/v1" in line for line in webui.summary)
    assert any(f"OLLAMA_BASE_URL={BASE}" in line for line in webui.summary)
    assert [p.path for p in webui.probes] == ["/v1/models", "/api/tags"]


def test_every_tool_plans_on_an_empty_home(tmp_path: Path) -> None:
    for tool in TOOLS:
        plan = plan_for(tool, ctx(tmp_path))
        assert plan.probes and plan.summary, tool.name
        if plan.path is not None:
            assert plan.old_text is None and plan.writes, tool.name


def test_models_best_first() -> None:
    found = [
        ModelChoice(name="small-emulated", native_tools=False, params=100),
        ModelChoice(name="big-emulated", native_tools=False, params=9000),
        ModelChoice(name="tools", native_tools=True, params=500),
    ]
    assert choose_models(found) == ("tools",)
    assert choose_models(found, all_models=True) == ("tools", "big-emulated", "small-emulated")
    assert choose_models([]) == ()


def test_write_then_rollback_leaves_the_file_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / ".codex" / "config.toml"
    original = put(path, "# mine\r\nmodel = 'o3'\r\n")
    path.chmod(0o600)
    plan = plan_for(find_tool("codex"), ctx(tmp_path))
    undo = write_plan(plan)
    assert path.read_bytes().decode() == plan.new_text and backup_path(path).read_bytes() == original.encode()
    rollback(undo)
    assert path.read_bytes() == original.encode() and path.stat().st_mode & 0o777 == 0o600
    assert not backup_path(path).exists()
    # A file that did not exist is removed again.
    fresh = plan_for(find_tool("claude"), ctx(tmp_path))
    assert fresh.path is not None
    undo = write_plan(fresh)
    assert fresh.path.exists()
    rollback(undo)
    assert not fresh.path.exists() and list(fresh.path.parent.iterdir()) == []


def test_disconnect_restores_the_first_original(tmp_path: Path) -> None:
    path = tmp_path / ".codex" / "config.toml"
    original = put(path, "# mine\nmodel = 'o3'\n")
    write_plan(plan_for(find_tool("codex"), ctx(tmp_path)))
    # A second connect (another model) keeps the first backup: disconnect returns to the user's file.
    second = context(home=tmp_path, env={}, base_url=BASE, key=None, models=("other",))
    write_plan(plan_for(find_tool("codex"), second))
    assert 'model = "other"' in path.read_text()
    done = blazar(tmp_path, "disconnect", "codex")
    assert done.returncode == 0 and "restored" in done.stdout, done.stderr
    assert path.read_text() == original and not backup_path(path).exists()
    again = blazar(tmp_path, "disconnect", "codex")
    assert again.returncode == 0 and "no backup" in again.stdout
    created = plan_for(find_tool("llm"), ctx(tmp_path))
    write_plan(created)
    assert created.path is not None and restore(created.path) is not None and not created.path.exists()


def test_connect_write_rolls_back_when_the_daemon_cannot_answer(tmp_path: Path) -> None:
    path = tmp_path / ".codex" / "config.toml"
    original = put(path, "# mine\nmodel = 'o3'\n")
    done = blazar(tmp_path, "connect", "codex", "--write", "--model", "m", "--url", unreachable_url())
    assert done.returncode == 1
    assert "test request failed" in done.stderr and "rolled back" in done.stderr
    assert path.read_bytes() == original.encode() and not backup_path(path).exists()


def test_connect_prints_the_plan_as_a_diff(tmp_path: Path) -> None:
    put(tmp_path / ".codex" / "config.toml", "# mine\n")
    done = blazar(tmp_path, "connect", "codex", "--model", "m1", "--url", "http://127.0.0.1:1/v1")
    assert done.returncode == 0, done.stderr
    assert '+model = "m1"' in done.stdout and '+base_url = "http://127.0.0.1:1/v1"' in done.stdout
    assert "test request: POST /v1/responses (streamed)" in done.stdout
    assert (tmp_path / ".codex" / "config.toml").read_text() == "# mine\n"  # only a plan
    unknown = blazar(tmp_path, "connect", "vim")
    assert unknown.returncode == 1 and "no tool named 'vim'" in unknown.stderr
    as_json = blazar(tmp_path, "connect", "aider", "--model", "m1", "--url", "http://127.0.0.1:1", "--json")
    assert as_json.returncode == 0, as_json.stderr
    (plan,) = json.loads(as_json.stdout)
    assert plan["tool"] == "aider" and plan["changes"] is True and plan["models"] == ["m1"]
    assert "+model: ollama_chat/m1" in plan["diff"]
    assert [p["path"] for p in plan["probes"]] == ["/api/show", "/api/chat"]


def test_connect_without_a_daemon_or_a_port_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "blazar").mkdir()
    (tmp_path / "blazar" / "config.toml").write_text("port = 0\n")
    done = blazar(tmp_path, "connect", "codex", "--model", "m1")
    assert done.returncode == 1 and "port = 0" in done.stderr and "--url" in done.stderr
    (tmp_path / "blazar" / "config.toml").write_text("port = 11999\n")
    done = blazar(tmp_path, "connect", "codex", "--model", "m1")
    assert done.returncode == 0 and "no daemon runs" in done.stderr
    assert 'base_url = "http://127.0.0.1:11999/v1"' in done.stdout
    none = blazar(tmp_path, "connect", "codex")
    assert none.returncode == 1 and "no chat model is installed" in none.stderr


def test_probe_answers_are_read_as_the_tool_reads_them() -> None:
    chat = Probe(method="POST", path="/v1/chat/completions", answer="sse-chat")
    assert "then [DONE]" in check_answer(chat, 'data: {"choices": []}\n\ndata: [DONE]\n\n')
    with pytest.raises(ProbeFailed, match="without"):
        check_answer(chat, 'data: {"choices": []}\n\n')
    with pytest.raises(ProbeFailed, match="failed"):
        check_answer(chat, 'data: {"error": {"message": "boom"}}\n\n')
    resp = Probe(method="POST", path="/v1/responses", answer="sse-responses")
    assert "response.incomplete" in check_answer(resp, "event: response.incomplete\ndata: {}\n\n")
    anth = Probe(method="POST", path="/v1/messages", answer="sse-anthropic")
    assert "message_stop" in check_answer(anth, "event: message_stop\ndata: {}\n\n")
    nd = Probe(method="POST", path="/api/chat", answer="ndjson")
    assert "done" in check_answer(nd, '{"done": false}\n{"done": true}\n')


def test_launch_env_points_every_tool_at_the_daemon() -> None:
    env = launch_env(BASE + "/", "k", "m")
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == f"{BASE}/v1"
    assert env["ANTHROPIC_BASE_URL"] == env["OLLAMA_HOST"] == BASE
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == env["BLAZAR_API_KEY"] == "k"
    assert env["ANTHROPIC_MODEL"] == "m" and env["AIDER_MODEL"] == "ollama_chat/m"
    assert "ANTHROPIC_MODEL" not in launch_env(BASE, "k", None)


def test_launch_execs_the_command_with_that_env(tmp_path: Path) -> None:
    code = "import os, sys; print(os.environ['OPENAI_BASE_URL'], os.environ['ANTHROPIC_MODEL'], sys.argv[1:])"
    done = blazar(
        tmp_path,
        "launch",
        "--url",
        "http://127.0.0.1:9",
        "-m",
        "zz",
        sys.executable,
        "-c",
        code,
        "--model",
        "x",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "http://127.0.0.1:9/v1 zz ['--model', 'x']"
    missing = blazar(tmp_path, "launch", "--url", "http://127.0.0.1:9", "no-such-command-here")
    assert missing.returncode == 1 and "cannot run 'no-such-command-here'" in missing.stderr


DAEMON_CONFIG = "# my daemon\nslots = 2  # two at once\n"


def test_connect_warns_when_the_first_turn_cannot_fit(tmp_path: Path, model_path: Path) -> None:
    """The 16-token test request would pass, but Claude Code's ~19,000-token first turn does not
    fit SmolLM2's default 4,096 per slot, nor its 8,192-token training: connect says so, with the
    ctx to set, the rope scaling it would need, and models trained for it."""
    make_home(tmp_path / "blazar", model_path, config=DAEMON_CONFIG)
    done = blazar(tmp_path, "connect", "claude", "--url", unreachable_url())
    assert done.returncode == 0, done.stderr
    assert "warning: Claude Code's first turn is about 19,000 tokens" in done.stdout
    assert "smollm2-135m gets 4,096 per slot (the daemon's default ctx)" in done.stdout
    assert 'set ctx = 32768 under [models."smollm2-135m"]' in done.stdout
    assert 'rope_scaling = "yarn"' in done.stdout and "qwen3-0.6b (40,960)" in done.stdout
    codex = blazar(tmp_path, "connect", "codex", "--url", unreachable_url(), "--json")
    assert codex.returncode == 0, codex.stderr
    (fit,) = json.loads(codex.stdout)[0]["context"]
    assert (fit["fits"], fit["suggest_ctx"], fit["training_allows"]) == (False, 8192, True)
    # A measured first turn that fits, and an unmeasured tool, say so or nothing.
    aider = blazar(tmp_path, "connect", "aider", "--url", unreachable_url())
    assert "context: smollm2-135m gets 4,096 tokens per slot" in aider.stdout
    cline = blazar(tmp_path, "connect", "cline", "--url", unreachable_url())
    assert cline.returncode == 0 and "context:" not in cline.stdout and "warning" not in cline.stdout
    assert (tmp_path / "blazar" / "config.toml").read_text() == DAEMON_CONFIG


def test_connect_ctx_is_planned_then_refused_above_training(tmp_path: Path, model_path: Path) -> None:
    make_home(tmp_path / "blazar", model_path, config=DAEMON_CONFIG)
    config = tmp_path / "blazar" / "config.toml"
    plan = blazar(tmp_path, "connect", "codex", "--ctx", "8192", "--url", unreachable_url())
    assert plan.returncode == 0, plan.stderr
    assert 'with --write: models."smollm2-135m".ctx = 8192' in plan.stdout
    assert "context: smollm2-135m gets 8,192 tokens per slot" in plan.stdout and "warning" not in plan.stdout
    assert config.read_text() == DAEMON_CONFIG  # a plan writes nothing
    refused = blazar(tmp_path, "connect", "claude", "--ctx", "32768", "--write", "--url", unreachable_url())
    assert refused.returncode == 1
    assert "above the 8192-token context smollm2-135m was trained for" in refused.stderr
    assert "rope_scaling" in refused.stderr
    assert config.read_text() == DAEMON_CONFIG and not (tmp_path / ".claude").exists()
    # Extended with rope scaling, the same ctx is accepted (and the first turn then fits).
    config.write_text(DAEMON_CONFIG + '\n[models."smollm2-135m"]\nrope_scaling = "yarn"\n')
    extended = blazar(tmp_path, "connect", "claude", "--ctx", "32768", "--url", unreachable_url())
    assert extended.returncode == 0, extended.stderr
    assert "context: smollm2-135m gets 32,768 tokens per slot" in extended.stdout


def test_connect_write_sets_ctx_and_cap_and_rolls_them_back_with_the_tool(
    tmp_path: Path, model_path: Path
) -> None:
    """aider sends no output cap: connect sets one for the model, beside --ctx, in the daemon's
    config.toml (comments kept); when the tool's test request fails, both are undone."""
    make_home(tmp_path / "blazar", model_path, config=DAEMON_CONFIG)
    config = tmp_path / "blazar" / "config.toml"
    plan = blazar(tmp_path, "connect", "aider", "--ctx", "8192", "--url", unreachable_url())
    assert (
        'with --write: models."smollm2-135m".ctx = 8192, models."smollm2-135m".max_output_tokens = 2048'
        in plan.stdout
    )
    assert "aider sends no output cap" in plan.stdout
    done = blazar(tmp_path, "connect", "aider", "--write", "--ctx", "8192", "--url", unreachable_url())
    assert done.returncode == 1
    assert (
        f'wrote models."smollm2-135m".ctx = 8192, models."smollm2-135m".max_output_tokens = 2048 in {config}'
        in done.stdout
    )
    assert "test request failed" in done.stderr and f"rolled back: {config} is as it was" in done.stderr
    assert config.read_text() == DAEMON_CONFIG
    # A cap the user set is kept, and nothing else is planned.
    config.write_text(DAEMON_CONFIG + "max_output_tokens = 512\n")
    kept = blazar(tmp_path, "connect", "llm", "--url", unreachable_url())
    assert "top-level max_output_tokens applies" in kept.stdout and "with --write" not in kept.stdout


def test_the_daemon_config_edit_keeps_the_users_comments(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blazar.cli.config import write_edits
    from blazar.config import resolve_paths
    from blazar.config.edit import resolve_key

    make_home(tmp_path, model_path, config=DAEMON_CONFIG + '\n[models."smollm2-135m"]\nslots = 1  # one\n')
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    paths = resolve_paths()
    before, after = write_edits(paths, {resolve_key('models."smollm2-135m".ctx'): 8192})
    assert after.models["smollm2-135m"].ctx == 8192 and before.models["smollm2-135m"].ctx is None
    assert (tmp_path / "config.toml").read_text() == (
        DAEMON_CONFIG + '\n[models."smollm2-135m"]\nslots = 1  # one\nctx = 8192\n'
    )
