"""Run tables -> tracker scalars: the pure mapping behind `tokengrad publish` and live trackers
(`Recorder(output=Output(trackers=...))`).

    scalars = run_scalars(load_run("runs/demo"))        # [Scalar(tag, step, value), ...]
    scalars = table_scalars({"steps": df, "layers": ...})  # the same from in-memory tables (one step, live)

Per-token rows stay in Parquet; trackers get per-step aggregates under grouped tags (TAGS lists them):

    tokengrad/<steps column>                      loss, grad_norm, reward_mean, kl, clip_frac, lr, ...
    tokengrad/layer/<block>/grad_norm             per-block gradient norm before clipping
    tokengrad/bucket/<lo>-<hi>/<field>            token_share, update_share, grad_norm, cos_to_total,
                                                  dprob_mean, correct_ratio of a probability bucket
    tokengrad/bucket/residual/update_share        the gradient part not built on log pi
    tokengrad/dead_step                           1 when no loss token had a nonzero advantage (no gradient)
    tokengrad/eval/<task>/<difficulty>/accuracy   evaluation accuracy

Across ranks and updates: steps scalars are the mean over ranks (counts `n_*` the sum); block norms and
bucket shares are the same on every rank (reduced before they are recorded) and are averaged over the
step's optimizer updates, except `grad_norm`s, which take the max over updates like the steps table.
No torch here: the read-side layer.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from tokengrad import schema
from tokengrad.schema import BUCKET, EVAL, LAYER, STEP, TOK

PREFIX = "tokengrad"
BUCKET_FIELDS = ("token_share", "update_share", "grad_norm", "cos_to_total", "dprob_mean", "correct_ratio")
_KEYS = {STEP.step, STEP.rank}

# The tag families written, for docs/trackers.md and the CLI help.
TAGS = {
    f"{PREFIX}/<steps column>": "every numeric column of the steps table (schema.STEPS and extra columns)",
    f"{PREFIX}/layer/<block>/grad_norm": "per-block gradient norm before clipping (layers table)",
    f"{PREFIX}/bucket/<lo>-<hi>/<field>": f"probability bucket figures: {', '.join(BUCKET_FIELDS)}",
    f"{PREFIX}/bucket/residual/<field>": "grad_norm and update_share of the part not built on log pi",
    f"{PREFIX}/dead_step": "1 if no loss token of the step had a nonzero advantage, else 0",
    f"{PREFIX}/eval/<task>/<difficulty>/accuracy": "evaluation accuracy (evals table)",
}


class Scalar(NamedTuple):
    tag: str
    step: int
    value: float


def run_scalars(run) -> list[Scalar]:
    """Every tracker scalar of a run (`tokengrad.read.runs.Run`), ordered by step then tag."""
    tables = {name: run.table(name) for name in ("steps", "layers", "buckets", "evals")}
    return table_scalars(tables, dead=dead_steps_sql(run))


def table_scalars(tables: dict[str, pd.DataFrame], dead: pd.Series | None = None) -> list[Scalar]:
    """Scalars of whatever tables are given (missing or empty ones give none).

    Args:
        tables: table name -> DataFrame in the run format (e.g. one step's tables, or a whole run's).
        dead: step -> bool (no gradient); default derived from a `tokens` table if one is given.
    """
    if dead is None and _rows(tables.get("tokens")):
        dead = dead_steps(tables["tokens"])
    out = (
        step_scalars(tables.get("steps"))
        + layer_scalars(tables.get("layers"))
        + bucket_scalars(tables.get("buckets"))
        + eval_scalars(tables.get("evals"))
        + dead_scalars(dead)
    )
    return sorted(out, key=lambda s: (s.step, s.tag))


def step_scalars(steps: pd.DataFrame | None) -> list[Scalar]:
    if not _rows(steps):
        return []
    cols = [c for c in steps.columns if c not in _KEYS and pd.api.types.is_numeric_dtype(steps[c])]
    cols = [c for c in cols if not pd.api.types.is_bool_dtype(steps[c])]
    counts = [c for c in cols if c.startswith("n_")]
    g = steps.groupby(STEP.step)
    agg = pd.concat([g[[c for c in cols if c not in counts]].mean(), g[counts].sum(min_count=1)], axis=1)
    return _melt(agg, lambda col: f"{PREFIX}/{col}")


def layer_scalars(layers: pd.DataFrame | None) -> list[Scalar]:
    if not _rows(layers):
        return []
    g = layers.groupby([LAYER.step, LAYER.layer])[LAYER.grad_norm].max()
    return [
        Scalar(f"{PREFIX}/layer/{_tag_part(layer)}/grad_norm", int(step), float(v))
        for (step, layer), v in g.items()
        if _finite(v)
    ]


def bucket_scalars(buckets: pd.DataFrame | None) -> list[Scalar]:
    if not _rows(buckets):
        return []
    fields = [f for f in BUCKET_FIELDS if f in buckets.columns]
    agg = {f: ("max" if f == BUCKET.grad_norm else "mean") for f in fields}
    g = buckets.groupby([BUCKET.step, BUCKET.bucket], sort=True).agg(agg)
    bounds = buckets.groupby(BUCKET.bucket)[[BUCKET.lo, BUCKET.hi]].first()
    out = []
    for (step, bucket), row in g.iterrows():
        name = _bucket_name(bucket, bounds)
        out += [
            Scalar(f"{PREFIX}/bucket/{name}/{f}", int(step), float(row[f])) for f in fields if _finite(row[f])
        ]
    return out


def eval_scalars(evals: pd.DataFrame | None) -> list[Scalar]:
    if not _rows(evals):
        return []
    g = evals.groupby([EVAL.step, EVAL.task, EVAL.difficulty])
    acc = g.apply(lambda d: _weighted_accuracy(d), include_groups=False)
    return [
        Scalar(f"{PREFIX}/eval/{_tag_part(task)}/{_tag_part(diff)}/accuracy", int(step), float(v))
        for (step, task, diff), v in acc.items()
        if _finite(v)
    ]


def dead_scalars(dead: pd.Series | None) -> list[Scalar]:
    if dead is None or not len(dead):
        return []
    return [Scalar(f"{PREFIX}/dead_step", int(step), float(bool(v))) for step, v in dead.items()]


def dead_steps(tokens: pd.DataFrame) -> pd.Series:
    """step -> True when no loss token of the step has a nonzero advantage (the policy gradient is 0)."""
    t = tokens[tokens[TOK.in_loss].astype(bool)] if TOK.in_loss in tokens else tokens
    live = t[TOK.advantage].fillna(0).abs().gt(0).groupby(t[TOK.step]).any()
    return (~live).reindex(sorted(tokens[TOK.step].unique()), fill_value=True).rename("dead")


def dead_steps_sql(run) -> pd.Series:
    """dead_steps over a run's token files without loading them (one DuckDB aggregate)."""
    if not run.files("tokens"):
        return pd.Series(dtype=bool, name="dead")
    df = run.sql(
        f"SELECT {TOK.step} AS step, "
        f"bool_or({TOK.in_loss} AND coalesce(abs({TOK.advantage}), 0) > 0) AS live "
        f"FROM tokens GROUP BY {TOK.step} ORDER BY {TOK.step}"
    )
    return (~df["live"].astype(bool)).set_axis(df["step"].astype(int)).rename("dead")


class NonFinite(NamedTuple):
    """Recorded NaN / ±inf values of one metric, which trackers cannot plot and publish leaves out."""

    tag: str
    nan: int
    inf: int
    first_step: int
    last_step: int

    def __str__(self) -> str:
        counts = " and ".join(f"{n} {kind}" for n, kind in ((self.nan, "NaN"), (self.inf, "inf")) if n)
        steps = f"step {self.first_step}"
        if self.last_step != self.first_step:
            steps = f"steps {self.first_step}-{self.last_step}"
        return f"{self.tag}: {counts} ({steps})"


# table -> (grouping columns naming the tag, value columns); steps: every numeric column
_NONFINITE_SOURCES = {
    "layers": ([LAYER.layer], [LAYER.grad_norm]),
    "buckets": ([BUCKET.bucket, BUCKET.lo, BUCKET.hi], list(BUCKET_FIELDS)),
    "evals": ([EVAL.task, EVAL.difficulty], [EVAL.accuracy]),
}


def nonfinite_values(run) -> list[NonFinite]:
    """Every metric of a run (`tokengrad.read.runs.Run`) holding recorded NaN or ±inf values, by tag.

    Counted in the Parquet files, where a value recorded as NaN differs from one not recorded (null): a
    step that logged no `kl` is not counted, a step that logged `kl=nan` is.
    """
    out = []
    for table in ("steps", *_NONFINITE_SOURCES):
        if not run.files(table):
            continue
        columns = run.sql(f"SELECT * FROM {table} LIMIT 0")
        keys, values = _NONFINITE_SOURCES.get(table, ([], _steps_value_columns(columns)))
        for col in [c for c in values if c in columns.columns]:
            out += _nonfinite_of(run, table, keys, col)
    return sorted(out, key=lambda n: n.tag)


def _steps_value_columns(columns: pd.DataFrame) -> list[str]:
    return [
        c
        for c in columns.columns
        if c not in _KEYS and pd.api.types.is_float_dtype(columns[c])  # integers and bools hold no NaN or inf
    ]


def _nonfinite_of(run, table: str, keys: list[str], col: str) -> list[NonFinite]:
    group = ", ".join(f'"{k}"' for k in keys)
    value = f'CAST("{col}" AS DOUBLE)'
    bad = f"NOT isfinite({value})"
    # FILTER clauses, not WHERE: DuckDB prunes Parquet row groups on their min/max statistics, which
    # leave NaN out, so a WHERE on the value can skip the very rows holding NaN
    df = run.sql(
        f"SELECT {group + ',' if group else ''} count(*) FILTER (WHERE isnan({value})) AS nan, "
        f"count(*) FILTER (WHERE isinf({value})) AS inf, min(step) FILTER (WHERE {bad}) AS first, "
        f"max(step) FILTER (WHERE {bad}) AS last FROM {table} {'GROUP BY ' + group if group else ''}"
    )
    return [
        NonFinite(
            tag=_nonfinite_tag(table, row, col),
            nan=int(row.nan),
            inf=int(row.inf),
            first_step=int(row.first),
            last_step=int(row.last),
        )
        for row in df.itertuples(index=False)
        if row.nan or row.inf
    ]


def _nonfinite_tag(table: str, row, col: str) -> str:
    """The tracker tag the value would have had (the same names as step/layer/bucket/eval_scalars)."""
    if table == "layers":
        return f"{PREFIX}/layer/{_tag_part(row.layer)}/grad_norm"
    if table == "buckets":
        name = row.bucket if row.bucket == schema.RESIDUAL_BUCKET else f"{row.lo:.2f}-{row.hi:.2f}"
        return f"{PREFIX}/bucket/{name}/{col}"
    if table == "evals":
        return f"{PREFIX}/eval/{_tag_part(row.task)}/{_tag_part(row.difficulty)}/accuracy"
    return f"{PREFIX}/{col}"


# ---- helpers ----------------------------------------------------------------------------------------


def _bucket_name(bucket: str, bounds: pd.DataFrame) -> str:
    """'[0.25,0.50)' -> '0.25-0.50'; the residual keeps its name."""
    if bucket == schema.RESIDUAL_BUCKET:
        return bucket
    lo, hi = bounds.loc[bucket, BUCKET.lo], bounds.loc[bucket, BUCKET.hi]
    return f"{lo:.2f}-{hi:.2f}"


def _weighted_accuracy(d: pd.DataFrame) -> float:
    n = d[EVAL.n].fillna(0)
    return float((d[EVAL.accuracy] * n).sum() / n.sum()) if n.sum() > 0 else float(d[EVAL.accuracy].mean())


def _melt(agg: pd.DataFrame, tag) -> list[Scalar]:
    return [
        Scalar(tag(col), int(step), float(v))
        for col in agg.columns
        for step, v in agg[col].items()
        if _finite(v)
    ]


def _tag_part(x) -> str:
    """A tag path component: '/' would open a new group, whitespace reads badly in tracker UIs."""
    return "_".join(str(x).replace("/", "_").split()) or "_"


def _finite(v) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _rows(df) -> bool:
    return df is not None and len(df) > 0
