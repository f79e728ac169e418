"""``blazar connect``, ``blazar disconnect`` and ``blazar launch``: the daemon from other tools.

``connect`` prints, for each supported tool found here (or the one named), the file it would
change, the change as a diff, the models offered and the test request; ``--write`` applies it
with a backup, sends that request as the tool would, and undoes the change when it fails.
``disconnect`` puts the backup back. ``launch`` runs a command with every variable the known
tools read pointed at the daemon. The plans themselves are made in ``blazar.connect``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, err, load_setup, open_store, out, print_json
from blazar.config import Config, Paths
from blazar.daemon.client import CliError, ensure_daemon, find_daemon

if TYPE_CHECKING:
    from blazar.config.edit import Key
    from blazar.connect import ModelChoice, Plan, Tool
    from blazar.connect.fit import Candidate, Fit, ModelContext

__all__ = ["connect", "disconnect", "launch"]

_Url = Annotated[
    str | None,
    Parameter(help="The daemon's URL (default: the running daemon's, else config.toml's host and port)."),
]
_Key = Annotated[
    str | None,
    Parameter(
        help="The API key the tool sends (`blazar keys add`); without it a placeholder, "
        "which the daemon accepts while it has no keys."
    ),
]
_Ctx = Annotated[
    int | None,
    Parameter(
        name="--ctx",
        help='Give the offered models this context per slot: `ctx` under [models."NAME"] in the '
        "daemon's config.toml (written with --write; refused above a model's training context "
        "unless rope_scaling extends it).",
    ),
]
_Models = Annotated[
    list[str] | None,
    Parameter(
        name=["--model", "-m"],
        negative="",
        consume_multiple=False,
        help="Offer this model (repeatable), first the default.",
    ),
]


def _local_url(config: Config) -> str:
    host = config.host if config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{config.port}"


def _daemon_url(paths: Paths, config: Config, url: str | None, *, start: bool) -> str:
    """``url``, else the running daemon's, else (``start``) a new background daemon's, else the config's."""
    if url is not None:
        return url.rstrip("/").removesuffix("/v1")
    daemon = find_daemon(paths)
    if daemon is None and start:
        daemon, started = ensure_daemon(paths, config)
        if started:
            err.print(f"[dim]started the daemon at {daemon.url}[/]")
    if daemon is not None:
        return daemon.url
    if config.port == 0:
        raise CliError(
            "config.toml sets port = 0 (a new port at each start): start the daemon first, or give --url"
        )
    local = _local_url(config)
    err.print(f"[dim]no daemon runs: the plan uses config.toml's address, {local}[/]")
    return local


def _installed_chat_models(paths: Paths) -> list[ModelChoice]:
    from blazar.connect import ModelChoice

    store = open_store(paths)
    found = []
    for record in store.list():
        if record.kind != "chat":
            continue
        try:
            info = store.info(record)
        except Exception:  # a model whose header cannot be read here is still offered, last
            found.append(ModelChoice(name=record.name, native_tools=False))
            continue
        if info.reranker:
            continue
        template = info.chat_template or ""
        found.append(
            ModelChoice(
                name=record.name,
                native_tools="tools" in template,
                params=info.parameter_count,
                ctx_train=info.context_length,
            )
        )
    return found


def _models(paths: Paths, given: list[str] | None, all_models: bool) -> tuple[str, ...]:
    from blazar.connect import choose_models

    if given:
        return tuple(given)
    chosen = choose_models(_installed_chat_models(paths), all_models=all_models)
    if not chosen:
        raise CliError("no chat model is installed — run `blazar pull NAME` first, or name one with --model")
    return chosen


def _model_contexts(
    paths: Paths, config: Config, models: tuple[str, ...], ctx: int | None = None
) -> dict[str, ModelContext | None]:
    """The context the daemon gives each model (``ctx``: as if set for each), from config.toml
    and the model's header; None for a model not installed here (its daemon is elsewhere)."""
    from blazar.connect.fit import model_context
    from registry.errors import RegistryError

    store = open_store(paths)
    found: dict[str, ModelContext | None] = {}
    for name in models:
        try:
            record = store.find(name)
        except RegistryError:  # not a name the store could hold
            record = None
        if record is None:
            found[name] = None
            continue
        try:
            trained = store.info(record).context_length
        except Exception:  # a header that cannot be read here: the daemon assumes its fallback
            trained = None
        over = config.models.get(record.name)
        found[name] = model_context(
            record.name,
            trained=trained,
            default_ctx=config.default_ctx,
            ctx=ctx or (over.ctx if over else None),
            rope_scaling=over.rope_scaling if over else None,
            rope_scale=over.rope_scale if over else None,
        )
    return found


def _candidates(paths: Paths) -> list[Candidate]:
    """Models that could hold a large prompt instead: the installed chat models, then the
    catalog's, with their training contexts."""
    from blazar.connect.fit import Candidate
    from registry.catalog import Catalog

    found = [
        Candidate(name=m.name, trained=m.ctx_train, installed=True, tools=m.native_tools, size=m.params)
        for m in _installed_chat_models(paths)
        if m.ctx_train
    ]
    have = {c.name for c in found}
    for entry in Catalog.load().entries():
        if entry.context_length and entry.name not in have and entry.kind in (None, "chat"):
            tools = "tools" in entry.capabilities
            size = entry.total_size() or 0
            found.append(
                Candidate(
                    name=entry.name, trained=entry.context_length, installed=False, tools=tools, size=size
                )
            )
    return found


class _DaemonEdits:
    """The keys connect writes into the daemon's config.toml: ``--ctx`` for the offered models,
    and an output cap for a tool that sends none."""

    def __init__(self) -> None:
        self.keys: dict[Key, Any] = {}

    def add(self, key: str, value: Any) -> None:
        from blazar.config.edit import resolve_key

        found = resolve_key(key)
        if found.dotted not in {k.dotted for k in self.keys}:
            self.keys[found] = value

    def shown(self) -> str:
        """``models."NAME".ctx = 8192, …``: the keys as config.toml's tables name them."""
        return ", ".join(
            (f'models."{k.path[1]}".{k.path[2]}' if k.path[0] == "models" else k.dotted) + f" = {v}"
            for k, v in self.keys.items()
        )


def _plan_ctx(
    contexts: dict[str, ModelContext | None], ctx: int, edits: _DaemonEdits
) -> dict[str, ModelContext | None]:
    """``--ctx``: refused for a model it cannot serve (nothing written), else planned for every
    offered model; the contexts the daemon will then give."""
    from blazar.connect.fit import ctx_refusal

    if ctx < 256:
        raise CliError(f"--ctx {ctx} is too small: a slot needs 256 tokens at least")
    changed: dict[str, ModelContext | None] = {}
    for name, model in contexts.items():
        if model is None:
            raise CliError(
                f"--ctx sets the context in this machine's config.toml, and {name} is not installed here"
            )
        if (refusal := ctx_refusal(model, ctx)) is not None:
            raise CliError(refusal)
        edits.add(f'models."{model.name}".ctx', ctx)
        changed[name] = msgspec.structs.replace(model, ctx=ctx, configured=True)
    return changed


def _plan_cap(
    tool: Tool, contexts: dict[str, ModelContext | None], config: Config, edits: _DaemonEdits
) -> list[str]:
    """An output cap for ``tool``'s models when it sends none (and the user set none): planned
    in ``edits``; what connect says of it."""
    from blazar.connect.fit import output_cap_edit

    said = []
    for model in contexts.values():
        if model is None:
            continue
        over = config.models.get(model.name)
        cap, line = output_cap_edit(
            tool.name,
            tool.output_cap,
            model.name,
            model_cap=over.max_output_tokens if over else None,
            top_cap_set=config.max_output_tokens is not None,
        )
        if cap is not None:
            edits.add(f'models."{model.name}".max_output_tokens', cap)
        if line:
            said.append(line)
    return said


def _fits(
    tool: Tool, contexts: dict[str, ModelContext | None], candidates: Any, *, ctx_given: bool
) -> list[Fit]:
    from blazar.connect.fit import check_fit

    fits = []
    for model in contexts.values():
        if model is None:
            continue
        fit = check_fit(
            tool.title,
            tool.first_turn_tokens,
            model,
            candidates(),
            ctx_given=ctx_given,
            command=f"blazar connect {tool.name}",
        )
        if fit is not None:
            fits.append(fit)
    return fits


def _fit_lines(fits: list[Fit]) -> list[str]:
    lines = []
    for fit in fits:
        if fit.fits:
            lines.append(
                f"context: {fit.model} gets {fit.ctx:,} tokens per slot — the first turn "
                f"(about {fit.first_turn:,}) and an answer fit"
            )
        else:
            lines.append(f"warning: {fit.lines[0]}")
            lines.extend(f"  {line}" for line in fit.lines[1:])
    return lines


def _diff(plan: Plan) -> list[str]:
    import difflib

    old = (plan.old_text or "").splitlines(keepends=True)
    new = (plan.new_text or "").splitlines(keepends=True)
    name = str(plan.path)
    lines = difflib.unified_diff(
        old, new, fromfile=name if plan.old_text is not None else "/dev/null", tofile=name
    )
    return [line.rstrip("\n") for line in lines]


def _print_plan(tool: Tool, plan: Plan) -> None:
    where = str(plan.path) if plan.path is not None else "no file (settings to enter by hand)"
    out.print(f"[bold]{tool.title}[/] ({tool.name}) — {where}", markup=True, highlight=False)
    for line in plan.summary:
        out.print(f"  {line}", markup=False)
    if plan.path is not None:
        if not plan.writes:
            out.print("  the file already says this: nothing to change", markup=False)
        else:
            out.print("  change:", markup=False)
            for line in _diff(plan):
                out.print(f"    {line}", markup=False)
    for probe in plan.probes:
        streamed = " (streamed)" if probe.answer != "json" else ""
        out.print(f"  test request: {probe.method} {probe.path}{streamed}", markup=False)


def _apply(tool: Tool, plan: Plan, base_url: str, timeout_s: float) -> tuple[bool, list[str]]:
    """Write the plan, send its test requests, undo on failure: whether it held, and what happened."""
    from blazar.connect.apply import ProbeFailed, rollback, send_probe, write_plan

    undo = write_plan(plan) if plan.writes else None
    said = [f"wrote {plan.path} (the original is kept for `blazar disconnect {tool.name}`)"] if undo else []
    for probe in plan.probes:
        try:
            said.append(f"test request passed: {send_probe(base_url, probe, timeout_s=timeout_s)}")
        except ProbeFailed as exc:
            said.append(f"test request failed: {exc}")
            if ": 401 " in str(exc):
                said.append("the daemon has API keys: give one with --key (`blazar keys add NAME`)")
            if undo is not None:
                rollback(undo)
                said.append(f"rolled back: {plan.path} is as it was")
            return False, said
    return True, said


def _write_daemon_edits(paths: Paths, edits: _DaemonEdits) -> tuple[bytes | None, list[str]]:
    """Write the planned keys into config.toml (a running daemon reloads it): the file as it was
    (None: there was none), for a rollback, and what was said."""
    from blazar.cli.config import report_change, write_edits

    target = Path(paths.config_file)
    previous = target.read_bytes() if target.exists() else None
    before, after = write_edits(paths, edits.keys)
    if before == after:
        return previous, [f"{target} already says this: nothing to change"]
    return previous, [f"wrote {edits.shown()} in {target}", *report_change(paths, before, after)]


def _restore_daemon_config(paths: Paths, previous: bytes | None) -> list[str]:
    """config.toml as it was before ``_write_daemon_edits`` (no tool connected)."""
    from blazar.cli.config import report_change
    from blazar.config import load_config
    from registry.files import atomic_write

    target = Path(paths.config_file)
    before = load_config(paths)
    if previous is None:
        target.unlink(missing_ok=True)
    else:
        atomic_write(target, previous, mode=target.stat().st_mode & 0o777)
    return [f"rolled back: {target} is as it was", *report_change(paths, before, load_config(paths))]


@app.command(name="connect")
def connect(
    tool: str | None = None,
    /,
    *,
    write: Annotated[
        bool,
        Parameter(
            negative="", help="Apply the change (with a backup), then test it; undone if the test fails."
        ),
    ] = False,
    all_models: Annotated[bool, Parameter(negative="", help="Offer every installed chat model.")] = False,
    model: _Models = None,
    ctx_tokens: _Ctx = None,
    key: _Key = None,
    url: _Url = None,
    timeout: Annotated[
        float, Parameter(help="Seconds to wait for a test answer (a first load takes a while).")
    ] = 300.0,
    json_: Json = False,
) -> None:
    """Point a tool at the daemon: codex, claude, opencode, continue, cline, open-webui, aider, llm.

    Without TOOL, every supported tool found on this machine. Prints the plan; --write applies it.
    Warns when a tool's first real turn does not fit the model's context, and says what to set."""
    # Imported here: the YAML and TOML editors cost every other command's start nothing.
    from blazar.connect import TOOLS, ConnectError, context, find_tool, installed, plan_for

    paths, config = load_setup()
    home = Path.home()
    if tool is not None:
        tools = [find_tool(tool)]
    else:
        tools = [t for t in TOOLS if installed(t, home, os.environ.get("PATH"))]
        if not tools:
            names = ", ".join(t.name for t in TOOLS)
            out.print(
                f"no supported tool found on this machine; name one to see its plan ({names})", markup=False
            )
            return
    models = _models(paths, model, all_models)
    contexts = _model_contexts(paths, config, models)
    edits = _DaemonEdits()
    if ctx_tokens is not None:  # refused before anything is written or started
        contexts = _plan_ctx(contexts, ctx_tokens, edits)
    caps = {entry.name: _plan_cap(entry, contexts, config, edits) for entry in tools}
    found: list[Candidate] | None = None

    def candidates() -> list[Candidate]:
        nonlocal found
        if found is None:
            found = _candidates(paths)
        return found

    base_url = _daemon_url(paths, config, url, start=write)
    ctx = context(home=home, env=os.environ, base_url=base_url, key=key, models=models)
    previous: bytes | None = None
    config_said: list[str] = []
    if edits.keys and write:
        previous, config_said = _write_daemon_edits(paths, edits)
    elif edits.keys:
        config_said = [f"with --write: {edits.shown()} in {paths.config_file}"]
    if not json_:
        for line in config_said:
            out.print(line, markup=False)
    failed: list[str] = []
    plans: list[dict[str, Any]] = []
    for entry in tools:
        try:
            plan = plan_for(entry, ctx)
        except ConnectError as exc:
            err.print(f"{entry.title}: {exc}", markup=False)
            failed.append(entry.name)
            continue
        fits = _fits(entry, contexts, candidates, ctx_given=ctx_tokens is not None)
        if json_:
            plans.append(
                {
                    "tool": entry.name,
                    "path": str(plan.path) if plan.path else None,
                    "changes": plan.writes,
                    "summary": plan.summary,
                    "models": plan.models,
                    "diff": _diff(plan) if plan.writes else [],
                    "probes": [{"method": p.method, "path": p.path} for p in plan.probes],
                    "context": [msgspec.to_builtins(f) for f in fits],
                    "output_cap": caps[entry.name],
                    "daemon_config": config_said,
                }
            )
        else:
            _print_plan(entry, plan)
            for line in [*_fit_lines(fits), *caps[entry.name]]:
                out.print(f"  {line}", markup=False)
        if not write:
            continue
        ok, said = _apply(entry, plan, base_url, timeout)
        if ok and any(not f.fits for f in fits):
            said.append(
                "connected, but its first real turn does not fit the model's context: see the warning above"
            )
        if not ok:
            failed.append(entry.name)
        if json_:
            plans[-1] |= {"connected": ok, "applied": said}
        else:
            for line in said:
                (out if ok else err).print(f"  {line}", markup=False)
    if write and edits.keys and len(failed) == len(tools):
        undone = _restore_daemon_config(paths, previous)
        if json_:
            for entry_doc in plans:
                entry_doc["daemon_config"] = [*config_said, *undone]
        else:
            for line in undone:
                err.print(line, markup=False)
    if json_:
        print_json(plans)
    if not write and not json_:
        out.print("(a plan only: `blazar connect [TOOL] --write` applies it)", markup=False)
    if failed:
        raise CliError(f"not connected: {', '.join(failed)}")


@app.command(name="disconnect")
def disconnect(tool: str, /) -> None:
    """Undo `blazar connect TOOL --write`: the tool's file as it was before the first connect."""
    from blazar.connect import find_tool
    from blazar.connect.apply import restore

    entry = find_tool(tool)
    path = entry.path(Path.home(), os.environ)
    if path is None:
        out.print(
            f"{entry.title}: connect writes no file for it (its settings were entered by hand)", markup=False
        )
        return
    done = restore(path)
    if done is None:
        out.print(f"{entry.title}: no backup of {path} — nothing to restore", markup=False)
        return
    out.print(done, markup=False)


_LAUNCH_OPTIONS = {"--model": "model", "-m": "model", "--key": "key", "--url": "url"}


def _launch_options(tokens: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """The options before COMMAND, and COMMAND with its arguments, untouched (they are the tool's)."""
    options: dict[str, str] = {}
    rest = list(tokens)
    while rest and rest[0].startswith("-"):
        flag, _, value = rest.pop(0).partition("=")
        if flag == "--":
            break
        if flag not in _LAUNCH_OPTIONS:
            raise CliError(
                f"unknown option {flag} — blazar launch takes --model, --key and --url before COMMAND"
            )
        if not value:
            if not rest:
                raise CliError(f"{flag} needs a value")
            value = rest.pop(0)
        options[_LAUNCH_OPTIONS[flag]] = value
    return options, rest


@app.command(name="launch")
def launch(*tokens: Annotated[str, Parameter(allow_leading_hyphen=True, name="COMMAND")]) -> None:
    """Run COMMAND [ARGS…] with OPENAI_BASE_URL, ANTHROPIC_BASE_URL, OLLAMA_HOST, keys and model
    variables pointed at the daemon (started first when none runs).

    Options, before COMMAND: --model NAME (the model tools are told to use; default the best
    installed chat model), --key KEY (default a placeholder), --url URL (a daemon elsewhere:
    nothing is started). Everything from COMMAND on is passed to it untouched."""
    from blazar.connect import choose_models
    from blazar.connect.launch import launch_env

    options, command = _launch_options(tokens)
    if not command:
        raise CliError("name the command to run: blazar launch codex, blazar launch claude, …")
    paths, config = load_setup()
    url = options.get("url")
    base_url = _daemon_url(paths, config, url, start=url is None)
    model = options.get("model")
    if model is None:
        chosen = choose_models(_installed_chat_models(paths))
        model = chosen[0] if chosen else None
    env = os.environ | launch_env(base_url, options.get("key") or "local", model)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise CliError(f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
