"""`tokengrad export RUN [RUN ...] --out DIR --format png|svg|pdf`: the paper figure set of runs
(tokengrad.figures.export writes it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# tokengrad.figures.export.STATIC_FORMATS (tests/figures/test_export.py holds them equal): named here so that
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
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when a figure fails to draw (default: list it on stderr, write the others, exit 0)",
    )
    return p


def cli_export(argv: list[str]) -> int:
    """Entry point of `tokengrad export`. Returns 0 when every figure that could be drawn was written (a
    figure that failed is listed on stderr), 1 when only HTML could be written (no browser for static
    export), 2 on bad arguments, unreadable runs or an output folder that cannot take the files (disk
    full, read-only), 3 with --strict when a figure failed."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    from tokengrad.figures.export import OutputError, make_out_dir

    try:
        runs, figures = _figure_set(args)
    except (OSError, ValueError) as err:
        print(f"tokengrad export: error: {err}", file=sys.stderr)
        return 2
    for note in figures.notes:
        print(f"skipped {note}", file=sys.stderr)
    try:
        out = make_out_dir(Path(args.out))
        paths, failed, code = _write(runs, figures.specs, out, args)
    except OutputError as err:
        print(f"tokengrad export: error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    failed = figures.failed + failed
    for line in failed:
        print(f"failed {line}", file=sys.stderr)
    if failed:
        print(
            f"tokengrad export: {len(failed)} figure(s) failed (listed above); the other {len(paths)} "
            f"file(s) are written in {out}",
            file=sys.stderr,
        )
    return 3 if failed and args.strict and code == 0 else code


def _figure_set(args):
    from tokengrad.figures.figureset import build_figure_set, unique_names
    from tokengrad.read.runs import load_run

    runs = unique_names([load_run(p) for p in args.runs])
    figures = build_figure_set(
        runs,
        smoothing=args.smoothing,
        low=tuple(args.low),
        high=tuple(args.high),
        step_range=tuple(args.steps) if args.steps else None,
        max_words=args.words,
    )
    return runs, figures


def _write(runs, specs, out: Path, args) -> tuple[list[Path], list[str], int]:
    """headline.csv, captions.md and the figures: (paths written, figures failed, exit code 0 or 1)."""
    from tokengrad.figures.export import (
        INSTALL_HINT,
        BrowserNotFoundError,
        OutputError,
        export_static,
        write_atomic,
        write_captions,
        write_html,
    )
    from tokengrad.figures.figureset import headline_table, one_line

    paths, failed = [], []
    try:  # the numbers the headline figure shows (tokengrad.read.headline)
        table = headline_table(runs, tuple(args.steps) if args.steps else None)
        paths.append(write_atomic(out / "headline.csv", lambda p: table.to_csv(p, index=False)))
    except OutputError:
        raise
    except Exception as err:  # one table's failure must not cost the figures; reported, not hidden
        failed.append(f"headline.csv: {one_line(err)}")
    paths.append(write_captions(specs, out))
    try:
        result = export_static(specs, out, args.format)
    except OutputError:
        raise
    except (RuntimeError, OSError) as err:  # no browser, or it failed to start: fall back to HTML
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
        return paths + write_html(specs, out), failed, 1
    return paths + result.written, failed + result.failed, 0
