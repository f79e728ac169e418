"""``blazar config``: edits by key keep the user's file, refuse what the daemon would refuse."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blazar.cli import main
from blazar.config import load_config, resolve_paths
from blazar.config.presets import OWNED, PRESETS
from tests.tomlkit_versions import Scenario

COMMENTED = """\
# My Blazar settings
port = 0          # any free port
slots = 4         # four at once
max_queue = 64

# the engine, tuned by hand
[engine]
threads = 2
extra_args = ["-ngl", "0"]  # keep it on the CPU

[models."smollm2-135m"]
# a small context for the little model
ctx = 1024
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    return tmp_path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``blazar ARGV`` in this process: exit status, stdout, stderr."""
    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_cli(*argv: str) -> None:
    """``blazar ARGV`` in this process, for a scenario (no capsys there): it must succeed."""
    try:
        main(list(argv))
    except SystemExit as exc:
        assert not exc.code, f"blazar {' '.join(argv)} exited with {exc.code}"


# Scenarios (tests.tomlkit_versions): each runs on the installed tomlkit and on the oldest that
# pyproject.toml allows, and must leave the same text on both.


def set_and_unset(home: Path) -> list[str]:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    run_cli("config", "set", "slots", "2")
    run_cli("config", "set", "models.smollm2-135m.ctx", "2048")
    run_cli("config", "set", "models.qwen/qwen2.5-0.5b-instruct-gguf.slots", "1")
    run_cli("config", "set", "key_concurrency", "queue")  # a bare word is a string
    run_cli("config", "unset", "max_queue")
    run_cli("config", "set", "engine.extra_args", '["-ngl", "0", "-t", "2"]')
    edited = path.read_text()
    # The last key of a model's table takes the table with it.
    run_cli("config", "unset", "models.qwen/qwen2.5-0.5b-instruct-gguf.slots")
    return [edited, path.read_text()]


def test_set_and_unset_keep_comments_and_order(on_tomlkit: Callable[[Scenario], Any]) -> None:
    edited, unset = on_tomlkit(set_and_unset)
    assert edited == (
        "# My Blazar settings\n"
        "port = 0          # any free port\n"
        "slots = 2         # four at once\n"
        'key_concurrency = "queue"\n'  # after the last top-level key, not under the table's comment
        "\n"
        "# the engine, tuned by hand\n"
        "[engine]\n"
        "threads = 2\n"
        'extra_args = ["-ngl", "0", "-t", "2"]  # keep it on the CPU\n'
        "\n"
        '[models."smollm2-135m"]\n'
        "# a small context for the little model\n"
        "ctx = 2048\n"
        "\n"
        '[models."qwen/qwen2.5-0.5b-instruct-gguf"]\n'
        "slots = 1\n"
    )
    # The blank line tomlkit put before that table stays: the file ends with one.
    assert unset == edited.split('[models."qwen/')[0]


def test_set_checks_and_writes_atomically(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    assert cli(capsys, "config", "set", "slots", "2")[0] == 0
    assert cli(capsys, "config", "set", "key_concurrency", "queue")[0] == 0
    assert cli(capsys, "config", "unset", "max_queue")[0] == 0
    code, out, _ = cli(capsys, "config", "set", "models.qwen/qwen2.5-0.5b-instruct-gguf.slots", "1")
    assert code == 0 and "set models.qwen/qwen2.5-0.5b-instruct-gguf.slots" in out
    config = load_config(resolve_paths())
    assert (config.slots, config.max_queue, config.key_concurrency) == (2, 256, "queue")
    assert config.models["smollm2-135m"].ctx == 1024
    assert config.models["qwen/qwen2.5-0.5b-instruct-gguf"].slots == 1
    assert list(home.glob(".config-*")) == []  # the atomic write left no temp file


SPARSE = """\
# Blazar, by hand

# the engine
[engine]
threads = 2
# extra_args = ["-ngl", "99"] on the GPU box

# the models
[models."smollm2-135m"]
# nothing set yet

[models."other"]
  ctx = 1024
"""


def new_keys(home: Path) -> str:
    path = home / "config.toml"
    path.write_text(SPARSE)
    run_cli("config", "set", "slots", "2")
    run_cli("config", "set", "max_queue", "8")
    run_cli("config", "set", "engine.start_timeout_s", "60")
    run_cli("config", "set", "models.smollm2-135m.ctx", "2048")
    run_cli("config", "set", "models.other.slots", "1")
    return path.read_text()


def test_a_new_key_goes_after_the_last_key_of_its_table(on_tomlkit: Callable[[Scenario], Any]) -> None:
    """Comments and blank lines after a table's last key stay with the header below them; in a
    table without keys the key goes after the comments that open it, before a blank line."""
    assert on_tomlkit(new_keys) == (
        "# Blazar, by hand\n"
        "slots = 2\n"
        "max_queue = 8\n"
        "\n"
        "# the engine\n"
        "[engine]\n"
        "threads = 2\n"
        "start_timeout_s = 60\n"
        '# extra_args = ["-ngl", "99"] on the GPU box\n'
        "\n"
        "# the models\n"
        '[models."smollm2-135m"]\n'
        "# nothing set yet\n"
        "ctx = 2048\n"
        "\n"
        '[models."other"]\n'
        "  ctx = 1024\n"
        "  slots = 1\n"
    )


QUOTED = """\
host = '127.0.0.1'  # loopback only
key_concurrency = 'reject'  # say no when busy
otel_service_name = 'blazar'

[models.'smollm2-135m']
engine_version = 'b4000'
extra_args = ['-ngl', '0']
"""


def replace_quoted(home: Path) -> str:
    path = home / "config.toml"
    path.write_text(QUOTED)
    run_cli("config", "set", "key_concurrency", "queue")
    run_cli("config", "set", "models.smollm2-135m.engine_version", "b5000")
    run_cli("config", "set", "models.smollm2-135m.extra_args", '["-ngl", "0", "-t", "2"]')
    return path.read_text()


def test_a_replaced_value_is_written_in_blazars_quotes(on_tomlkit: Callable[[Scenario], Any]) -> None:
    """The rule: a value blazar writes is a double-quoted string (an array of them), whatever
    quotes the value it replaces had; its line keeps its comment, and the values blazar does not
    write keep the user's single quotes."""
    assert on_tomlkit(replace_quoted) == (
        "host = '127.0.0.1'  # loopback only\n"
        'key_concurrency = "queue"  # say no when busy\n'
        "otel_service_name = 'blazar'\n"
        "\n"
        "[models.'smollm2-135m']\n"
        'engine_version = "b5000"\n'
        'extra_args = ["-ngl", "0", "-t", "2"]\n'
    )


def apply_presets(home: Path) -> list[str]:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    run_cli("config", "preset", "low-memory", "--yes")
    low = path.read_text()
    run_cli("config", "preset", "throughput", "--model", "smollm2-135m", "--yes")
    return [low, path.read_text()]


def test_presets_keep_comments_and_order(on_tomlkit: Callable[[Scenario], Any]) -> None:
    low, throughput = on_tomlkit(apply_presets)
    assert low == (
        "# My Blazar settings\n"
        "port = 0          # any free port\n"
        "slots = 1         # four at once\n"
        "default_ctx = 2048\n"
        "keep_alive_s = 60.0\n"
        "max_loaded_models = 1\n"
        "jobs_max_running = 1\n"
        "\n"
        "# the engine, tuned by hand\n"
        "[engine]\n"
        "threads = 2\n"
        'extra_args = ["-ngl", "0", "-ctk", "q8_0", "-ctv", "q8_0"]  # keep it on the CPU\n'
        "\n"
        '[models."smollm2-135m"]\n'
        "# a small context for the little model\n"
        "ctx = 1024\n"
    )
    assert throughput == (
        "# My Blazar settings\n"
        "port = 0          # any free port\n"
        "slots = 8         # four at once\n"
        "keep_alive_s = 1800.0\n"
        "jobs_max_running = 4\n"
        "max_queue = 1024\n"
        "queue_timeout_s = 300.0\n"
        "\n"
        "# the engine, tuned by hand\n"
        "[engine]\n"
        "threads = 2\n"
        'extra_args = ["-ngl", "0"]  # keep it on the CPU\n'
        "\n"
        '[models."smollm2-135m"]\n'
        "# a small context for the little model\n"
        "ctx = 1024\n"
        "prompt_batch = 1024\n"
    )


def test_unknown_keys_are_refused_with_the_valid_ones(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    code, _, err = cli(capsys, "config", "set", "slotz", "2")
    assert code == 1
    assert "unknown key 'slotz'" in err and "did you mean `slots`?" in err
    assert "Valid keys:" in err and "default_ctx" in err and "keep_alive_s" in err
    code, _, err = cli(capsys, "config", "set", "engine.thread", "2")
    assert code == 1 and "in [engine]" in err and "`threads`" in err and "start_timeout_s" in err
    code, _, err = cli(capsys, "config", "set", "models.smollm2-135m.context", "2048")
    assert code == 1 and "unknown key 'context'" in err and "ctx" in err and "prompt_batch" in err
    code, _, err = cli(capsys, "config", "set", "queueing.max_queue", "8")
    assert code == 1 and "unknown key 'queueing'" in err and "max_queue" in err
    code, _, err = cli(capsys, "config", "set", "mcp.name", "x")
    assert code == 1 and "[[mcp]]" in err and "blazar config edit" in err
    code, _, err = cli(capsys, "config", "get", "engine")
    assert code == 1 and "is a table" in err and "threads" in err
    assert path.read_text() == COMMENTED


def test_wrong_types_and_values_are_refused_with_what_the_key_takes(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    code, _, err = cli(capsys, "config", "set", "slots", "many")
    assert code == 1 and "slots takes an integer" in err and "blazar config set slots 4" in err
    code, _, err = cli(capsys, "config", "set", "key_concurrency", "maybe")
    assert code == 1 and 'one of "queue", "reject"' in err
    code, _, err = cli(capsys, "config", "set", "models.smollm2-135m.rope_scaling", "cubic")
    assert code == 1 and '"linear", "yarn"' in err
    code, _, err = cli(capsys, "config", "set", "models.smollm2-135m.prompt_batch", "8")
    assert code == 1 and ">= 16" in err and "<= 8192" in err
    code, _, err = cli(capsys, "config", "set", "strict", "yes")
    assert code == 1 and "true or false" in err
    # A value of the right type that the loader's own checks refuse: the file stays as it was.
    code, _, err = cli(capsys, "config", "set", "slots", "0")
    assert code == 1 and "slots must be at least 1" in err
    code, _, err = cli(capsys, "config", "set", "tls_cert", str(home / "missing.pem"))
    assert code == 1 and "tls_cert and tls_key go together" in err
    assert path.read_text() == COMMENTED


def test_get_list_defaults_path(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = home / "config.toml"
    code, out, _ = cli(capsys, "config", "path")
    assert (code, out.strip()) == (0, str(path))
    code, out, err = cli(capsys, "config", "get", "slots")
    assert (code, out.strip()) == (0, "4") and "built-in default" in err
    path.write_text(COMMENTED)
    assert cli(capsys, "config", "get", "slots")[1].strip() == "4"
    assert cli(capsys, "config", "get", "engine.extra_args")[1].strip() == '["-ngl", "0"]'
    code, out, _ = cli(capsys, "config", "get", "models.smollm2-135m.ctx", "--json")
    assert json.loads(out) == {"key": "models.smollm2-135m.ctx", "value": 1024, "source": "config.toml"}
    assert cli(capsys, "config", "get", "models.other.ctx")[1].strip() == "unset"
    code, out, _ = cli(capsys, "config", "list")
    assert out.splitlines() == [
        "port = 0",
        "slots = 4",
        "max_queue = 64",
        "engine.threads = 2",
        'engine.extra_args = ["-ngl", "0"]',
        "models.smollm2-135m.ctx = 1024",
    ]
    code, out, _ = cli(capsys, "config", "defaults", "--json")
    rows = {row["key"]: row for row in json.loads(out)}
    assert rows["slots"]["default"] == 4 and rows["slots"]["takes"] == "an integer"
    assert rows["key_concurrency"]["takes"] == 'one of "queue", "reject"'
    assert rows["engine.start_timeout_s"]["default"] == 120.0
    assert rows["models.NAME.prompt_batch"]["takes"] == "an integer (>= 16, <= 8192) (or unset)"
    assert rows["mcp"]["takes"] == "a list of [[mcp]] tables"


def _editor(tmp_path: Path, line: str) -> str:
    """An $EDITOR that puts ``line`` first in the file it is given (a top-level key)."""
    script = tmp_path / "editor.py"
    script.write_text(
        "import sys, pathlib\n"
        "p = pathlib.Path(sys.argv[1])\n"
        f"p.write_text({line!r} + '\\n' + p.read_text())\n"
    )
    return f"{sys.executable} {script}"


def test_edit_saves_a_valid_file_and_keeps_the_old_one_otherwise(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    monkeypatch.setenv("EDITOR", _editor(home, "slotz = 3"))
    code, _, err = cli(capsys, "config", "edit")
    assert code == 1 and "unknown field `slotz`" in err and "config.toml.rejected" in err
    assert path.read_text() == COMMENTED
    assert (home / "config.toml.rejected").read_text() == "slotz = 3\n" + COMMENTED

    monkeypatch.setenv("EDITOR", _editor(home, "default_ctx = 2048"))
    code, out, err = cli(capsys, "config", "edit")
    assert code == 0 and f"saved {path}" in out, err
    assert path.read_text() == "default_ctx = 2048\n" + COMMENTED
    assert list(home.glob("config-*.toml")) == []  # the draft is gone


def test_presets_print_their_keys_and_need_yes_without_a_terminal(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = home / "config.toml"
    path.write_text(COMMENTED)
    code, out, err = cli(capsys, "config", "preset", "low-memory")
    assert code == 1 and "--yes" in err
    assert "  slots = 1" in out and "  default_ctx = 2048" in out
    assert '  engine.extra_args = ["-ngl", "0", "-ctk", "q8_0", "-ctv", "q8_0"]' in out
    assert "  max_queue: removed" in out
    assert path.read_text() == COMMENTED

    assert cli(capsys, "config", "preset", "low-memory", "--yes")[0] == 0
    config = load_config(resolve_paths())
    assert (config.slots, config.default_ctx, config.max_loaded_models) == (1, 2048, 1)
    assert config.engine.extra_args == ["-ngl", "0", "-ctk", "q8_0", "-ctv", "q8_0"]
    assert "# the engine, tuned by hand" in path.read_text()  # the user's comments stay

    code, out, _ = cli(capsys, "config", "preset", "agent", "--model", "smollm2-135m", "--yes")
    assert code == 0
    config = load_config(resolve_paths())
    assert (config.slots, config.default_ctx, config.keep_alive_s) == (2, 16384, -1.0)
    assert (config.max_loaded_models, config.mcp_default, config.preload) == (1, "all", ["smollm2-135m"])
    assert config.engine.extra_args == ["-ngl", "0"]  # the KV flags went, the user's flag stayed

    assert cli(capsys, "config", "preset", "throughput", "--model", "smollm2-135m", "--yes")[0] == 0
    config = load_config(resolve_paths())
    assert (config.slots, config.max_queue, config.jobs_max_running) == (8, 1024, 4)
    assert config.models["smollm2-135m"].prompt_batch == 1024

    assert cli(capsys, "config", "preset", "balanced", "--model", "smollm2-135m", "--yes")[0] == 0
    text = path.read_text()
    for key in OWNED:
        assert f"\n{key} =" not in text
    config = load_config(resolve_paths())
    assert config.models["smollm2-135m"].prompt_batch is None and config.models["smollm2-135m"].ctx == 1024
    code, out, _ = cli(capsys, "config", "preset", "balanced", "--yes")
    assert code == 0 and "nothing to write" in out
    code, _, err = cli(capsys, "config", "preset", "turbo")
    assert code == 1 and ", ".join(PRESETS) in err


def test_presets_use_only_keys_the_schema_has() -> None:
    from blazar.config.edit import resolve_key

    for preset in PRESETS.values():
        for key in preset.keys:
            assert key in OWNED
            resolve_key(key)
        for key in preset.model_keys:
            resolve_key(f"models.some-model.{key}")
    for key in OWNED:
        resolve_key(key)


def test_a_model_key_in_toml_s_quoted_form_names_the_model_itself() -> None:
    from blazar.config.edit import resolve_key

    assert resolve_key('models."smollm2-135m".slots').path == resolve_key("models.smollm2-135m.slots").path
    assert resolve_key("models.'qwen2.5:7b'.ctx").path == ("models", "qwen2.5:7b", "ctx")
