"""`tokengrad publish RUN --tensorboard DIR --wandb PROJECT`: a run's aggregates to experiment trackers.

Trackers cannot plot NaN or inf, so those values are left out of the published scalars; the command says
how many, of which metrics and at which steps (on stderr, after the "published" line), and exits 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

MAX_LISTED = 12  # metrics listed one per line in the NaN/inf report; the rest are counted


def staging_dir(logdir: Path) -> Path:
    """A fresh folder beside `logdir` (outside it: TensorBoard would list a folder inside as a run)."""
    return logdir.parent / f".{logdir.name}.partial-{os.getpid()}"


def move_into(stage: Path, logdir: Path) -> None:
    """Move the complete event files from `stage` into `logdir` (renames: each appears whole)."""
    logdir.mkdir(parents=True, exist_ok=True)
    for f in sorted(stage.iterdir()) if stage.is_dir() else ():
        os.replace(f, logdir / f.name)


def cli_publish(argv: list[str]) -> int:
    """`tokengrad publish RUN --tensorboard DIR --wandb PROJECT`."""
    p = argparse.ArgumentParser(
        prog="tokengrad publish",
        description="Write a run's per-step aggregates (grad norms, bucket shares, dead steps, evals, step "
        "scalars) to TensorBoard and/or W&B; docs/trackers.md lists the tags.",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files into DIR")
    p.add_argument("--wandb", metavar="PROJECT", help="log to this W&B project")
    p.add_argument(
        "--wandb-mode",
        choices=["online", "offline"],
        default=None,
        help="W&B mode (default: WANDB_MODE or online); offline runs sync with `wandb sync`",
    )
    p.add_argument("--wandb-name", default=None, help="W&B run name (default: the run's name)")
    p.add_argument("--wandb-dir", default=None, help="where W&B keeps its files (default: WANDB_DIR or .)")
    args = p.parse_args(argv)
    if not (args.tensorboard or args.wandb):
        p.error("give --tensorboard DIR and/or --wandb PROJECT")
    # imported after parsing so that --help and usage errors answer at once (pandas, the trackers)
    from tokengrad.integrations.trackers import backends, scalars
    from tokengrad.read.runs import load_run

    run = load_run(args.run)
    trackers = []
    if args.tensorboard:  # written next to DIR and moved in when complete: a killed publish leaves no
        stage = staging_dir(Path(args.tensorboard))  # partial event file that looks whole
        trackers.append(backends.make_tracker("tensorboard", stage))
    if args.wandb:
        name = args.wandb_name or run.name
        config = run.meta.get("config") or {}
        extra = {"dir": args.wandb_dir} if args.wandb_dir else {}
        trackers.append(
            backends.make_tracker(
                "wandb", args.wandb, mode=args.wandb_mode, name=name, config=config, **extra
            )
        )
    try:
        try:
            n = backends.publish_run(run, trackers)
        finally:
            for t in trackers:
                t.close()
        if args.tensorboard:
            move_into(stage, Path(args.tensorboard))
    finally:
        if args.tensorboard:
            shutil.rmtree(stage, ignore_errors=True)
    where = " and ".join(
        f"{type(t).__name__[:-7]} ({args.tensorboard if hasattr(t, 'logdir') else t.project})"
        for t in trackers
    )
    bad = scalars.nonfinite_values(run)
    print(f"published {n} scalars of {run.name} to {where}")
    if bad:
        print(report_nonfinite(bad), file=sys.stderr)
    return 0


def report_nonfinite(bad: list, shown: int = MAX_LISTED) -> str:
    """What publish left out: the NaN / inf count, then one line per metric (tag, counts, steps)."""
    total = sum(b.nan + b.inf for b in bad)
    lines = [
        f"left out {total} NaN/inf value(s) of {len(bad)} metric(s), which trackers cannot plot:",
        *(f"  {b}" for b in bad[:shown]),
    ]
    if len(bad) > shown:
        lines.append(f"  ... and {len(bad) - shown} more metric(s)")
    return "\n".join(lines)
