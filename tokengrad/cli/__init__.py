"""`tokengrad` command line: train, dashboard, export, inspect.

    tokengrad train configs/tiny_charset.toml steps=20 weighting=tr_grpo
    tokengrad dashboard sample_runs --port 8501
    tokengrad export sample_runs/* --out figures --format pdf
    tokengrad inspect sample_runs/lab_grpo        # summary of a run;  --schema prints the run format
    tokengrad publish sample_runs/lab_grpo --tensorboard tb   # aggregates to TensorBoard (--wandb PROJECT)
    tokengrad doctor sample_runs/* --fail-on critical      # ranked findings, token evidence, CI gate
    tokengrad import prime_rl outputs/run --out runs/prime  # another framework's per-token dump as a run

Each subcommand's own options: `tokengrad SUBCOMMAND --help`.

One error boundary for every subcommand: a user error (a bad path, an invalid config value or file, a port
out of range, an unreadable run) is one line on stderr, `tokengrad SUBCOMMAND: error: ...`, and exit code 2.
Set TOKENGRAD_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> (module, function taking argv and returning an exit code, one-line help)
SUBCOMMANDS = {
    "train": (
        "tokengrad.cli.train",
        "cli_train",
        "run the built-in GRPO / TR-GRPO trainer from a config file",
    ),
    "dashboard": (
        "tokengrad.cli.dashboard",
        "cli_dashboard",
        "serve the Streamlit dashboard on a folder of runs",
    ),
    "export": ("tokengrad.cli.export", "cli_export", "write the paper figure set of runs as PNG/SVG/PDF"),
    "inspect": ("tokengrad.cli.inspect", "cli_inspect", "print a run's summary, or the run-format schema"),
    "publish": (
        "tokengrad.cli.publish",
        "cli_publish",
        "write a run's aggregates to TensorBoard / W&B",
    ),
    "doctor": ("tokengrad.cli.doctor", "cli_doctor", "ranked findings on runs, with the tokens behind them"),
    "watch": ("tokengrad.cli.watch", "cli_watch", "tail a run written elsewhere and print new findings"),
    "import": (
        "tokengrad.cli.import_run",
        "cli_import",
        "load a per-token dump another framework wrote (TRL, prime-rl, NeMo-RL) as a run",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="tokengrad", description="Per-token gradient accounting for GRPO-style RL."
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, _, help_) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] == "--version":
        from tokengrad._version import __version__

        print(__version__)
        return 0
    if argv[0] not in SUBCOMMANDS:
        parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
    module, func, _ = SUBCOMMANDS[argv[0]]
    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except USER_ERRORS as err:
        if os.environ.get("TOKENGRAD_DEBUG"):
            raise
        print(f"tokengrad {argv[0]}: error: {_one_line(err)}", file=sys.stderr)
        return 2


# What a user can cause by what they typed or pointed at: bad values, missing/unreadable files. Anything
# else is a bug in tokengrad and keeps its traceback.
USER_ERRORS = (ValueError, OSError, KeyError)


def _one_line(err: BaseException) -> str:
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    from tokengrad.read.display import visible_text  # a path may hold terminal codes: shown, not run

    return visible_text(" ".join(text.split())) or type(err).__name__
