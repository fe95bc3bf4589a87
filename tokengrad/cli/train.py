"""`tokengrad train CONFIG [key=value ...] [--run-dir DIR] [--resume]`: the built-in trainer on a config."""

from __future__ import annotations

import argparse

from tokengrad.train import distributed as dist
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
    from tokengrad.train.trainer import Trainer

    trainer = Trainer(cfg).setup()
    run_dir = trainer.train()
    if dist.is_main():
        print(run_dir)
    return 0
