"""The session files (``actors/sessions.py``): names, listing and removal, on real files.

Saving and restoring need llama.cpp's server: tests/e2e/test_sessions_e2e.py."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.errors import SessionError
from actors.sessions import SessionInfo, check_name, list_sessions, model_dir, read_session, remove_session


def _session(home: Path, model: str, name: str, *, auto: bool = False) -> SessionInfo:
    info = SessionInfo(
        name=name, model=model, digest="sha256:" + "a" * 64, tokens=12, ctx_per_slot=4096, bytes=3,
        created_at=1.0, slot=0, auto=auto,
    )  # fmt: skip
    folder = model_dir(home, model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.bin").write_bytes(b"kv!")
    (folder / f"{name}.json").write_bytes(msgspec.json.encode(info))
    return info


@pytest.mark.parametrize("name", ["town", "a", "v1.2_x-y", "9lives"])
def test_good_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "_auto-4096-0", "../x", "a/b", ".hidden", "x" * 65, "sp ace"])
def test_bad_names_are_400(name: str) -> None:
    with pytest.raises(SessionError) as caught:
        check_name(name)
    assert caught.value.code == "BAD_REQUEST"


def test_list_read_and_remove(tmp_path: Path) -> None:
    a = _session(tmp_path, "smol", "town")
    _session(tmp_path, "smol", "_auto-4096-1", auto=True)
    b = _session(tmp_path, "org/other", "town")
    (model_dir(tmp_path, "smol") / "orphan.json").write_bytes(msgspec.json.encode(a))  # no .bin
    assert [(s.model, s.name) for s in list_sessions(tmp_path)] == [
        ("org/other", "town"),
        ("smol", "_auto-4096-1"),
        ("smol", "town"),
    ]
    assert read_session(model_dir(tmp_path, "org/other"), "town") == b
    assert read_session(model_dir(tmp_path, "smol"), "orphan") is None

    with pytest.raises(SessionError, match="several models"):
        remove_session(tmp_path, "town")
    assert remove_session(tmp_path, "town", "smol") == a
    assert not (model_dir(tmp_path, "smol") / "town.bin").exists()
    assert remove_session(tmp_path, "town") == b  # the only one left
    with pytest.raises(SessionError) as caught:
        remove_session(tmp_path, "town")
    assert caught.value.code == "SESSION_NOT_FOUND"


def test_llamacpp_engines_get_a_slot_save_folder_ending_in_a_separator(tmp_path: Path) -> None:
    from actors.engines.llamacpp import build_argv
    from actors.engines.llamacpp_host import build_params, parse_args
    from actors.engines.spec import LaunchSpec

    folder = str(model_dir(tmp_path, "smol"))
    spec = LaunchSpec(model="smol", path="/x.gguf", ctx_per_slot=1024, slots=2, slot_save_path=folder)
    argv = build_argv(spec, port=1, api_key="k", binary=None)
    assert argv[argv.index("--slot-save-path") + 1] == folder
    # llama.cpp's server joins the file name to the folder as given: the host ends it with "/".
    params = build_params(parse_args(argv[argv.index("-m") :]))
    assert params.slot_save_path == folder + "/"
    assert "--slot-save-path" not in build_argv(
        LaunchSpec(model="smol", path="/x.gguf", ctx_per_slot=1024, slots=2), port=1, api_key="k", binary=None
    )
