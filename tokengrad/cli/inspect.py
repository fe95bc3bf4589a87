"""`tokengrad inspect RUN` (a run's summary) and `tokengrad inspect --schema` (the run format)."""

from __future__ import annotations

import argparse
import warnings


def cli_inspect(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tokengrad inspect", description="Summarise a run directory.")
    p.add_argument("run", nargs="?", help="run directory")
    p.add_argument("--schema", action="store_true", help="print the run-format schema (markdown) and exit")
    args = p.parse_args(argv)
    from tokengrad import schema  # after parsing: --help answers without pyarrow and pandas
    from tokengrad.read.runs import load_run

    if args.schema or not args.run:
        print(schema.describe(), end="")
        return 0
    with warnings.catch_warnings():  # the reader's warnings are in run.warnings: summarised once below
        warnings.simplefilter("ignore", RuntimeWarning)
        run = load_run(args.run)
        text = summarize(run)
    print(text)
    return 0


def summarize(run) -> str:
    """A plain-text summary of a run (also used in tests). Names, paths and warnings come from the file
    system: controls and bidi overrides in them are printed as escapes, never sent to the terminal."""
    from tokengrad.read.display import visible_text
    from tokengrad.read.skipped import skipped_lines
    from tokengrad.read.status import not_uploaded

    m = run.meta
    steps = run.steps
    lines = [
        f"run        {run.label}  ({run.path})",  # the folder, meta.json's name beside it if it differs
        (
            f"schema     v{m.get('schema_version')}  tokengrad {m.get('tokengrad_version')}  "
            f"created {m.get('created')}"
        ),
        f"model      {m.get('model')}  tokenizer {m.get('tokenizer')}  world_size {m.get('world_size')}",
        f"weighting  {m.get('weighting', {}).get('name')} {m.get('weighting', {}).get('params', {})}",
        f"finished   {m.get('finished')}  rows dropped {run.rows_dropped}",
    ]
    if run.url is not None:
        lines.append(f"bucket     {run.url}  (read from the local copy above)")
    lines += [
        f"upload     rank {b['rank']}: {b['files_not_uploaded']} files not uploaded to {b.get('url')} "
        f"(they stay in {b.get('staging')})"
        for b in not_uploaded(run.rank_status)
    ]
    if len(steps):
        last = steps.iloc[-1]
        lines.append(
            f"steps      {steps['step'].nunique()} (last {int(last['step'])})  "
            f"grad_norm mean {steps['grad_norm'].mean():.4g}  reward_mean last {last['reward_mean']:.4g}"
        )
    n_tok = run.sql("SELECT count(*) AS n FROM tokens")["n"].iloc[0]
    lines.append(f"tokens     {n_tok} rows in {len(run.files('tokens'))} files")
    for table in ("layers", "buckets", "samples", "evals"):
        lines.append(f"{table:<10} {len(run.table(table))} rows")
    lines += _provenance_lines(m)
    lines += _loss_lines(run)  # unreadable files grouped, with the steps they held
    lines += [f"warning    {w}" for w in skipped_lines([w for w in run.warnings if not _is_skip(w)])]
    return "\n".join(visible_text(line) for line in lines)


def _loss_lines(run) -> list[str]:
    """What the run's reads lack, one line per loss (files grouped: 5,000 empty files are one line):
    unreadable files with the steps they held, rank folders that are gone (tokengrad.read.unreadable)."""
    from tokengrad.read.unreadable import run_losses

    return [f"lost       {line}" for line in run_losses(run).lines]


def _is_skip(warning: str) -> bool:
    """A reader warning about a skipped file: said by a `lost` line already."""
    return warning.startswith(("skipped file ", "skipped corrupt file "))


def _provenance_lines(meta: dict) -> list[str]:
    """An imported run: its source, and per table the columns the source did not record."""
    from tokengrad.read.provenance import NOT_RECORDED, imported, not_recorded, source_note

    info = imported(meta)
    if info is None:
        return []
    lines = [f"source     {source_note(meta)}"]
    for table in ("tokens", "samples", "steps"):
        cols = sorted(not_recorded(meta, table))
        if cols and table not in (info.get("tables_not_recorded") or []):
            lines.append(f"{NOT_RECORDED}, {table}: {', '.join(cols)}")
    tables = info.get("tables_not_recorded") or []
    if tables:
        lines.append(f"{NOT_RECORDED}, tables: {', '.join(tables)}")
    return lines
