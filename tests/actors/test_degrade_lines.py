"""The parser of an engine's startup log into named degrades, on lines the bundled llama.cpp
wrote (captured from ``actors.engines.llamacpp_host`` with the flags that provoke each)."""

from __future__ import annotations

from actors.engines.degrades import DEGRADES, parse, scrub

# The engine's stderr with --mlock under a 64 KiB RLIMIT_MEMLOCK and -c 100000 (trained on 8192).
CAPPING = "the slot context (100096) exceeds the training context of the model (8192) - capping"
MLOCK = (
    "warning: failed to mlock 31866880-byte buffer (after previously locking 0 bytes): Cannot allocate memory"
)
STARTUP = "\n".join(
    [
        "llamacpp_host: loading /home/ann/.local/share/blazar/models/blobs/sha256-b1 with xllamacpp 2026.10",
        f"0.00.857.634 W {MLOCK}",
        "Try increasing RLIMIT_MEMLOCK ('ulimit -l' as root).",
        "0.00.865.567 W llama_context: n_ctx_seq (100096) > n_ctx_train (8192) -- possible training context",
        f"0.04.649.175 W srv    load_model: {CAPPING}",
        "llamacpp_host: llama.cpp server listening on http://127.0.0.1:18993",
        "0.06.903.781 W slot   operator(): id  0 | task 9 | need to evaluate at least 1 token for each slot",
    ]
)


def test_each_degrade_is_named_once_with_its_line() -> None:
    found = parse(STARTUP)
    assert [d.name for d in found] == ["ctx_reduced", "mlock_failed"]
    assert found[0].line == f"srv    load_model: {CAPPING}"
    assert found[1].line == MLOCK
    assert parse(STARTUP + STARTUP) == found  # one per name, the first line that said so


def test_a_clean_start_has_none() -> None:
    clean = "\n".join(line for line in STARTUP.splitlines() if " W " not in line)
    assert parse(clean) == ()
    # an overflow warning alone is what rope scaling asks for, not a degrade
    assert parse("0.00.5 W llama_context: n_ctx_seq (16384) > n_ctx_train (8192) -- possible training") == ()


def test_other_wordings_of_llama_cpp() -> None:
    lines = {
        "mmap_fallback": "0.00.1 W llama_model_loader: mmap failed: Cannot allocate memory",
        "flash_attn_off": "llama_context: flash_attn is not compatible with Grok - forcing off",
        "flash_attn_cpu": (
            "0.01.2 W llama_context: flash attention is not supported by the current backend; "
            "falling back to CPU (performance will be degraded)"
        ),
        "buffer_fallback": "W llama_lora_adapter_init_impl: lora for 'a' cannot use buft 'CUDA0', fallback to CPU",  # noqa: E501
    }
    for name, line in lines.items():
        assert [d.name for d in parse(line)] == [name], line
    assert set(DEGRADES) >= set(lines)


def test_local_paths_are_scrubbed() -> None:
    tail = "with error: EINVAL. Falling back to buffered I/O"
    (found,) = parse(f"0.00.2 W llama_file: Failed to open file '/srv/models/sha256-ab' {tail}")
    assert found.name == "mmap_fallback"
    assert found.line == f"llama_file: Failed to open file '<path>' {tail}"
    assert scrub("E load: cannot read /home/ann/m.gguf (size 12)") == "load: cannot read <path> (size 12)"
    assert scrub("listening on http://127.0.0.1:8080") == "listening on http://127.0.0.1:8080"
