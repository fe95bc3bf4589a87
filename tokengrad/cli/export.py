"""`tokengrad export RUN [RUN ...] --out DIR --format png|svg|pdf`: the paper figure set of runs
(tokengrad.figures.export writes it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# tokengrad.figures.export.STATIC_FORMATS (tests/test_export.py holds them equal): named here so that
# --help answers without importing plotly and pandas, which the figure modules import after parsing
FORMATS = ("png", "svg", "pdf")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokengrad export", description="Write the paper figure set of runs as PNG/SVG/PDF."
    )
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument(
        "--format",
        nargs="+",
        default=["png"],
        choices=FORMATS,
        help="image format(s) (default png, 300 dpi); several, e.g. --format pdf png, share one browser",
    )
    p.add_argument("--smoothing", type=float, default=0.6, help="debiased-EMA weight in [0, 1) (default 0.6)")
    p.add_argument(
        "--low",
        type=float,
        nargs=2,
        default=(0.0, 0.25),
        metavar=("LO", "HI"),
        help="probability range of the low-probability word cloud (default 0 0.25)",
    )
    p.add_argument(
        "--high",
        type=float,
        nargs=2,
        default=(0.75, 1.0),
        metavar=("LO", "HI"),
        help="probability range of the high-probability word cloud (default 0.75 1)",
    )
    p.add_argument(
        "--steps",
        type=int,
        nargs=2,
        default=None,
        metavar=("FIRST", "LAST"),
        help="steps (inclusive) for the token-level figures (default all)",
    )
    p.add_argument("--words", type=int, default=150, help="words per cloud (default 150)")
    return p


def cli_export(argv: list[str]) -> int:
    """Entry point of `tokengrad export`. Returns 0 on success, 1 when only HTML could be written (no
    browser for static export), 2 on bad arguments or unreadable runs."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    from tokengrad.figures.export import (
        INSTALL_HINT,
        BrowserNotFoundError,
        write_captions,
        write_html,
        write_static,
    )
    from tokengrad.figures.figureset import build_figure_set, headline_table, unique_names
    from tokengrad.read.runs import load_run

    try:
        runs = unique_names([load_run(p) for p in args.runs])
        specs, notes = build_figure_set(
            runs,
            smoothing=args.smoothing,
            low=tuple(args.low),
            high=tuple(args.high),
            step_range=tuple(args.steps) if args.steps else None,
            max_words=args.words,
        )
    except (OSError, ValueError) as err:
        print(f"tokengrad export: error: {err}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"skipped {note}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "headline.csv"  # the numbers the headline figure shows (tokengrad.read.headline)
    headline_table(runs, tuple(args.steps) if args.steps else None).to_csv(table, index=False)
    print(table)
    print(write_captions(specs, out))
    code = 0
    try:
        paths = write_static(specs, out, args.format)
    except (RuntimeError, OSError) as err:  # no browser, or it failed to start/render: fall back to HTML
        reason = (
            str(err)
            if isinstance(err, BrowserNotFoundError)
            else f"{type(err).__name__}: {err}\n{INSTALL_HINT}"
        )
        print(
            f"tokengrad export: cannot write {'/'.join(args.format).upper()}: {reason}\n"
            "Writing HTML instead.",
            file=sys.stderr,
        )
        paths, code = write_html(specs, out), 1
    for path in paths:
        print(path)
    return code
