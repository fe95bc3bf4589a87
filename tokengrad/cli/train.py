"""`tokengrad train CONFIG [key=value ...] [--run-dir DIR] [--resume]`: the built-in trainer on a config.

Ctrl-C and SIGTERM (what schedulers and `docker stop` send) stop it the same way: the step in flight is
discarded, every completed step is flushed to disk, the rank status and meta.json are written
(finished: false), and one line says where to resume; exit status 130 (Ctrl-C) or 143 (SIGTERM).

tokengrad's own warnings (a checkpoint a full disk refused, rows that could not be written) print as one line
each, naming the folder, the disk and what a `--resume` continues from.

The arguments are parsed and the config checked before torch is imported (the registries' names come from
tokengrad.train.names; the trainer's modules are imported when the run starts), so `--help` and a bad
config value answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

from tokengrad.cli.signals import Terminated, sigterm_unwinds
from tokengrad.train.config import describe_config, load_config


def cli_train(argv: list[str]) -> int:
    """`tokengrad train CONFIG [key=value ...] [--run-dir DIR] [--resume]`."""
    parser = argparse.ArgumentParser(
        prog="tokengrad train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train with GRPO and a token-weighting rule; records a tokengrad run.",
        epilog="config keys (set in the file or as key=value):\n" + describe_config(),
    )
    parser.add_argument("config", help="TOML or YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override config keys")
    parser.add_argument("--run-dir", help="run directory (same as run_dir=...)")
    parser.add_argument("--resume", action="store_true", help="continue the run in the run directory")
    args = parser.parse_intermixed_args(argv)
    extra = [f"run_dir={args.run_dir}"] * bool(args.run_dir) + ["resume=true"] * args.resume
    cfg = load_config(args.config, [*args.overrides, *extra])  # a ValueError ends in the CLI's error line
    from tokengrad.train import distributed as dist
    from tokengrad.train.trainer import Trainer

    trainer = Trainer(cfg)
    try:
        with sigterm_unwinds(), _own_warnings_on_one_line():
            run_dir = trainer.setup().train()
    except KeyboardInterrupt as err:
        print(_stopped_line(trainer, err), file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    if dist.is_main():
        print(run_dir)
    return 0


@contextlib.contextmanager
def _own_warnings_on_one_line():
    """tokengrad's own warnings (a checkpoint the disk refused, rows that could not be written) are whole
    sentences: print each as its one line, without Python's file:line prefix and source echo. Other
    warnings, and all of them under TOKENGRAD_DEBUG, keep the usual form."""
    usual = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):
        text = str(message)
        if text.startswith("tokengrad") and not os.environ.get("TOKENGRAD_DEBUG"):
            return " ".join(text.split()) + "\n"
        return usual(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = usual


def _stopped_line(trainer, err: KeyboardInterrupt) -> str:
    by = "SIGTERM" if isinstance(err, Terminated) else "Ctrl-C"
    rec = getattr(trainer, "rec", None)
    if rec is None:
        return f"tokengrad train: stopped by {by} before training began"
    done = (
        "no step completed this session"
        if rec.last_step is None
        else f"steps up to {rec.last_step} are recorded"
    )
    return (
        f"tokengrad train: stopped by {by}; the step in flight was discarded, {done} in {trainer.run_dir} "
        "(continue with --resume)"
    )
