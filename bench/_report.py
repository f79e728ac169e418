"""Markdown for one result file (the harness writes it next to the JSON; BENCHMARK.md reuses it)."""

from __future__ import annotations

from typing import Any

__all__ = ["fmt", "machine_line", "render_result", "render_table", "render_targets"]


def fmt(value: Any) -> str:
    """A number at a precision that suits its size; a run summary as ``median [min, max]``."""
    if value is None:
        return "n/a"
    if isinstance(value, dict) and "median" in value:
        if value.get("median") is None:
            return "n/a"
        if value.get("n", 0) > 1 and value["min"] != value["max"]:
            return f"{fmt(value['median'])} [{fmt(value['min'])}, {fmt(value['max'])}]"
        return fmt(value["median"])
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        size = abs(value)
        if size >= 100:
            return f"{value:.0f}"
        if size >= 10:
            return f"{value:.1f}"
        if size >= 1:
            return f"{value:.2f}"
        if size == 0:
            return "0"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def render_table(table: dict[str, Any]) -> str:
    columns = table["columns"]
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|",
    ]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in table["rows"]]
    out = f"**{table['title']}**\n\n" if table.get("title") else ""
    return out + "\n".join(lines) + "\n"


def render_targets(
    targets: list[dict[str, Any]],
    notes: dict[str, str] | None = None,
    *,
    sources: dict[str, str] | None = None,
) -> str:
    """The targets table; below it each unmet target's explanation (or a placeholder asking
    for one in bench/notes.toml) and any other note. ``sources`` adds a column linking each
    target's result file."""
    if not targets:
        return ""
    head = "| target | goal | measured median [min, max] | met |"
    rule = "|---|---:|---:|:---:|"
    if sources is not None:
        head, rule = head + " result |", rule + "---|"
    lines = [head, rule]
    for t in targets:
        measured = fmt({"median": t["median"], "min": t["min"], "max": t["max"], "n": t["n"]})
        unit = f" {t['unit']}" if t["unit"] and t["median"] is not None else ""
        met = "n/a" if t["met"] is None else ("✅" if t["met"] else "❌")
        row = f"| {t['label']} | {t['target']} | {measured}{unit} | {met} |"
        if sources is not None:
            row += f" {sources.get(t['id'], 'not run')} |"
        lines.append(row)
    explained = []
    for t in targets:
        note = (notes or {}).get(t["id"], "").strip()
        if t["met"] is False and not note:
            note = "_gap not explained yet: add it to bench/notes.toml_"
        if note:
            explained.append(f"- **{t['label']}**: {note}")
    return "\n".join(lines) + "\n" + ("\n" + "\n".join(explained) + "\n" if explained else "")


def machine_line(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    return (
        f"{m.get('cpu_model', '?')}, {m.get('cpus_usable', m.get('cpus', '?'))} cores, "
        f"{m.get('ram_gib', '?')} GiB RAM, {gpus}; {m.get('platform', '')}"
    )


def _param(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_param(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_param(v) for v in value)
    return str(value)


def render_result(
    result: dict[str, Any],
    *,
    plot_prefix: str = "",
    heading: str = "#",
    target_notes: dict[str, str] | None = None,
    comment: str = "",
) -> str:
    """The markdown of one benchmark result. ``target_notes`` and ``comment`` come from
    bench/notes.toml when BENCHMARK.md is generated."""
    parts = [f"{heading} {result['title']}\n"]
    when = f"{result['date']}{' (quick run: smoke only, not a measurement)' if result.get('quick') else ''}"
    parts.append(f"Run {when} in {result.get('duration_s', 0):.0f} s on {machine_line(result)}.")
    load = result.get("loadavg", {})
    if load:
        parts.append(f"Load average before/after: {load.get('before')} / {load.get('after')}.\n")
    parts.append(result.get("method", "").strip() + "\n")
    params = result.get("params") or {}
    if params:
        parts.append("Parameters: " + "; ".join(f"{k} = {_param(v)}" for k, v in params.items()) + ".\n")
    if comment.strip():
        parts.append(comment.strip() + "\n")
    if result.get("targets"):
        parts.append(render_targets(result["targets"], target_notes))
    for table in result.get("tables", []):
        parts.append(render_table(table))
    for plot in result.get("plots", []):
        parts.append(f"![{plot['title']}]({plot_prefix}{plot['file']})\n")
    for note in result.get("notes", []):
        parts.append(f"- {note}")
    if result.get("notes"):
        parts.append("")
    versions = ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items())
    parts.append(f"Versions: {versions}.\n")
    commands = result.get("commands", {})
    if commands:
        parts.append("Commands:\n")
        for name, cmd in commands.items():
            text = cmd if isinstance(cmd, str) else " ".join(cmd)
            if "\n" in text.strip():
                parts.append(
                    f"- {name}:\n\n  ```\n"
                    + "\n".join(f"  {ln}" for ln in text.strip().splitlines())
                    + "\n  ```"
                )
            else:
                parts.append(f"- {name}: `{text}`")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"
