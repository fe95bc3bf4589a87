"""`tokengrad publish RUN --tensorboard DIR --wandb PROJECT`: a run's aggregates to experiment trackers."""

from __future__ import annotations

import argparse

from tokengrad.integrations.trackers.backends import make_tracker, publish_run
from tokengrad.read.runs import load_run


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
    run = load_run(args.run)
    trackers = []
    if args.tensorboard:
        trackers.append(make_tracker("tensorboard", args.tensorboard))
    if args.wandb:
        name = args.wandb_name or run.name
        config = run.meta.get("config") or {}
        extra = {"dir": args.wandb_dir} if args.wandb_dir else {}
        trackers.append(
            make_tracker("wandb", args.wandb, mode=args.wandb_mode, name=name, config=config, **extra)
        )
    try:
        n = publish_run(run, trackers)
    finally:
        for t in trackers:
            t.close()
    where = " and ".join(
        f"{type(t).__name__[:-7]} ({t.logdir if hasattr(t, 'logdir') else t.project})" for t in trackers
    )
    print(f"published {n} scalars of {run.name} to {where}")
    return 0
