"""`tokengrad import FORMAT SRC --out RUN_DIR`: a per-token dump another framework wrote, as a run.

tokengrad import prime_rl outputs/my_run --out runs/my_run_prime
tokengrad import trl_completions trl_out --out runs/trl_import --group-size 8
tokengrad import --list                       # the formats
"""

from __future__ import annotations

import argparse


def cli_import(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tokengrad import",
        description="Import a dump another framework wrote (read-only) into a new run directory.",
    )
    p.add_argument("format", nargs="?", help="import format (--list shows them)")
    p.add_argument("src", nargs="?", help="the dump: its file or folder")
    p.add_argument("--out", help="the new run directory")
    p.add_argument("--group-size", type=int, help="completions per prompt, where the dump does not say")
    p.add_argument("--reward-columns", help="trl_completions: the reward functions' columns, comma-separated")
    p.add_argument(
        "--reward-weights", help="trl_completions: their weights, comma-separated (default 1 each)"
    )
    p.add_argument("--list", action="store_true", help="list the import formats and exit")
    args = p.parse_args(argv)
    from tokengrad.importers import import_run, load_importers  # after parsing: --help without torch

    if args.list or not args.format:
        print(load_importers().describe())
        return 0
    if not args.src or not args.out:
        p.error("give the dump (SRC) and the new run directory (--out)")
    meta = import_run(
        args.format,
        args.src,
        args.out,
        group_size=args.group_size,
        reward_columns=_names(args.reward_columns),
        reward_weights=[float(w) for w in _names(args.reward_weights) or []] or None,
    )
    print(summary(meta, args.out))
    return 0


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def summary(meta: dict, out: str) -> str:
    """What was imported and what the source did not record."""
    from tokengrad.read.display import visible_text

    imp = meta["imported"]
    rows = ", ".join(f"{t} {n}" for t, n in imp["rows"].items())
    lines = [f"imported {imp['format']} from {imp['source']} into {out}: {rows} rows"]
    for table, cols in imp["not_recorded"].items():
        if cols:
            lines.append(f"not recorded by the source, {table}: {', '.join(cols)}")
    lines.append(f"tables not recorded by the source: {', '.join(imp['tables_not_recorded']) or 'none'}")
    lines.append(f"next: tokengrad doctor {out}   (detectors that need those columns say 'not checked')")
    return "\n".join(visible_text(line) for line in lines)
