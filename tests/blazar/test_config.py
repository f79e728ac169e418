"""config.toml is strict and typed; BLAZAR_HOME moves every path."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.config import Config, ConfigError, load_config, resolve_paths


def test_blazar_home_moves_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    monkeypatch.delenv("BLAZAR_CACHE_DIR", raising=False)
    paths = resolve_paths()
    assert paths.config_file == str(tmp_path / "config.toml")
    assert paths.models_dir == str(tmp_path / "models")
    assert paths.run_dir == str(tmp_path / "run") and paths.log_dir == str(tmp_path / "logs")
    assert paths.cache_dir == str(tmp_path / "cache")
    runtime = load_config(paths).runtime(paths)
    assert runtime.home == str(tmp_path) and runtime.slots == 4 and runtime.default_ctx == 4096


def test_missing_file_means_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    assert load_config(resolve_paths()) == Config()


def test_a_full_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(
        'port = 11434\nslots = 2\ndefault_ctx = 2048\nallowed_hosts = ["box.lan"]\n'
        '[engine]\nstart_timeout_s = 30\nextra_args = ["--no-warmup"]\n'
        '[models."smollm2-135m"]\nctx = 1024\nslots = 1\n'
    )
    config = load_config(resolve_paths())
    assert (config.port, config.slots, config.default_ctx) == (11434, 2, 2048)
    assert config.engine.start_timeout_s == 30 and config.engine.extra_args == ["--no-warmup"]
    assert config.models["smollm2-135m"].ctx == 1024


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("prot = 1\n", "prot"),
        ("[engine]\nstart_timeout = 3\n", "start_timeout"),
        ('port = "high"\n', "port"),
        ("slots = 0\n", "slots"),
        ("port = = 1\n", "config.toml"),
    ],
)
def test_bad_files_name_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, fragment: str
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(resolve_paths())
    assert fragment in str(info.value)


def test_context_and_output_limits_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(
        "strict = true\nmax_output_tokens = 512\n"
        '[models."smollm2-135m"]\nctx = 16384\nrope_scaling = "yarn"\nrope_scale = 2.0\n'
        "max_output_tokens = 0\nlate_chunking_max_tokens = 64\n"
    )
    paths = resolve_paths()
    config = load_config(paths)
    model = config.models["smollm2-135m"]
    assert (model.rope_scaling, model.rope_scale, model.max_output_tokens) == ("yarn", 2.0, 0)
    assert model.late_chunking_max_tokens == 64
    runtime = config.runtime(paths)
    assert runtime.strict and runtime.max_output_tokens == 512
    assert Config().max_output_tokens is None and not Config().strict  # unset: no cap, not strict


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[models."m"]\nrope_scaling = "ntk"\n', "rope_scaling"),
        ('[models."m"]\nrope_scaling = "yarn"\nrope_scale = 1.0\n', "rope_scale"),
        ('[models."m"]\nrope_scale = 4.0\n', "rope_scale needs rope_scaling"),
        ("max_output_tokens = -1\n", "max_output_tokens"),
        ('[models."m"]\nmax_output_tokens = -5\n', "max_output_tokens"),
        ('strict = "yes"\n', "strict"),
        ('[models."m"]\nlate_chunking_max_tokens = 0\n', "late_chunking_max_tokens"),
        ('[models."m"]\nlate_chunking_max_tokens = "big"\n', "late_chunking_max_tokens"),
    ],
)
def test_bad_limits_name_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, fragment: str
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(resolve_paths())
    assert fragment in str(info.value)


def test_a_remote_key_file_is_read_into_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    secret = tmp_path / "peer-key"
    secret.write_text("blz-from-a-secret\n")  # a mounted Secret or `echo` ends with a newline
    (tmp_path / "config.toml").write_text(
        f'[[remotes]]\nname = "pool"\ndns = "blazar.ns.svc.cluster.local"\nport = 11435\n'
        f'key_file = "{secret}"\n'
        '[[remotes]]\nname = "box"\nurl = "http://box:11435"\nkey = "blz-inline"\n'
    )
    pool, box = load_config(resolve_paths()).remotes
    assert (pool.key, pool.key_file) == ("blz-from-a-secret", None)
    assert box.key == "blz-inline"


@pytest.mark.parametrize(
    ("content", "said"), [(None, "cannot be read"), ("", "holds no key"), ("a b", "holds no key")]
)
def test_a_bad_remote_key_file_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, said: str
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    secret = tmp_path / "peer-key"
    if content is not None:
        secret.write_text(content)
    (tmp_path / "config.toml").write_text(
        f'[[remotes]]\nname = "box"\nurl = "http://box:11435"\nkey_file = "{secret}"\n'
    )
    with pytest.raises(ConfigError, match=said) as info:
        load_config(resolve_paths())
    assert "'box'" in str(info.value) and "key_file" in str(info.value)


def test_speculation_is_read_strictly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from actors.config import Speculation

    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(
        'spec = "ngram"\nspec_governor = false\n[models.a]\nspec = {draft = "b", max = 8}\n'
        '[models.c]\nspec = {ngram = "ngram-mod", max = 32, min = 4}\n[models.d]\nspec = "off"\n'
    )
    config = load_config(resolve_paths())
    assert config.spec == "ngram" and config.spec_governor is False
    assert config.models["a"].spec == Speculation(draft="b", max=8)
    assert config.models["c"].spec == Speculation(ngram="ngram-mod", max=32, min=4)
    assert config.models["d"].spec == "off"
    for text, fragment in (
        ('spec = {draft = "b"}', "pairs with one model"),
        ("[models.a]\nspec = {max = 3}", "one way to draft"),
        ('[models.a]\nspec = {draft = "b", ngram = "ngram-mod"}', "one way to draft"),
        ('spec = "fast"', "spec"),
        ('[models.a]\nspec = {ngram = "ngram-huge"}', "ngram"),
        ('[models.a]\nspec = {ngram = "ngram-mod", max = 4, min = 9}', "above its max"),
        ('[models.a]\nspec = {ngram = "ngram-mod", depth = 3}', "depth"),
    ):
        (tmp_path / "config.toml").write_text(text)
        with pytest.raises(ConfigError, match=fragment):
            load_config(resolve_paths())
