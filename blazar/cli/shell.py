"""``blazar completions``: shell completion for the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from cyclopts import Parameter

from blazar.cli._app import app
from blazar.cli._common import out
from blazar.daemon.client import CliError

Shell = Literal["bash", "zsh", "fish"]


@app.command
def completions(
    shell: Shell,
    *,
    install: Annotated[
        bool, Parameter(negative="", help="Write it where the shell reads completions, and load it at start.")
    ] = False,
    output: Annotated[Path | None, Parameter(help="With --install: write it here instead.")] = None,
) -> None:
    """Print the shell completion script for bash, zsh or fish (or --install it).

    Print: `eval "$(blazar completions bash)"` in ~/.bashrc, or `blazar completions fish | source`."""
    if output is not None and not install:
        raise CliError(
            "--output says where --install writes the script: add --install, or redirect the print"
        )
    if not install:
        print(app.generate_completion(prog_name="blazar", shell=shell), end="")
        return
    path = app.install_completion(shell=shell, output=output, add_to_startup=output is None)
    out.print(f"installed {shell} completion in {path}; open a new shell to use it", markup=False)
