"""The study's summary statistics: mean over seeds with a percentile bootstrap 95 % interval (resampling
seeds), the paired difference of every rule to a baseline (grpo) on the same seeds, and the markdown report
(docs/study_results.md). Used by scripts/study.py."""

from __future__ import annotations

import numpy as np
import pandas as pd

N_BOOT = 10_000


def bootstrap_ci(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """(mean, 2.5 %, 97.5 %) of the mean by a percentile bootstrap over the values (seeds)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return (np.nan, np.nan, np.nan)
    means = rng.choice(v, size=(N_BOOT, v.size), replace=True).mean(1)  # [N_BOOT]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(v.mean()), float(lo), float(hi)


def fmt(ci: tuple[float, float, float]) -> str:
    m, lo, hi = ci
    return "n/a" if not np.isfinite(m) else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def cell(values: np.ndarray, rng: np.random.Generator) -> str:
    """'mean [2.5 %, 97.5 %]' over the finite values; one value has no interval and says so."""
    v = values[np.isfinite(values)]
    return f"{v[0]:.3f} (one seed)" if v.size == 1 else fmt(bootstrap_ci(v, rng))


def _count(g: pd.DataFrame, metrics: list[str]) -> int:
    """Seeds (or pairs) with a value for any of the metrics (a metric a seed did not record is NaN)."""
    cols = [m for m in metrics if m in g]
    return int(g[cols].apply(pd.to_numeric, errors="coerce").notna().any(axis=1).sum()) if cols else 0


def _paired(g: pd.DataFrame, base: pd.DataFrame, seeds, metrics: list[str]) -> pd.DataFrame:
    cols = [m for m in metrics if m in g and m in base]
    return g.loc[seeds, cols].astype(float) - base.loc[seeds, cols].astype(float)


def summary_tables(
    df: pd.DataFrame, metrics: list[str], rules: list[str], baseline: str = "grpo", seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per rule in `rules` order: mean [95 % CI] over seeds; paired difference to the baseline [95 % CI])."""
    rng = np.random.default_rng(seed)
    est, diff = [], []
    base = df[df["rule"] == baseline].set_index("seed")
    for rule in [r for r in rules if r in set(df["rule"])]:
        g = df[df["rule"] == rule].set_index("seed")
        cells = {m: cell(g[m].to_numpy(float), rng) if m in g else "n/a" for m in metrics}
        est.append({"rule": rule, "seeds": _count(g, metrics), **cells})
        if rule != baseline and len(base):
            paired = g.index.intersection(base.index)
            diff.append(
                {
                    "rule": f"{rule} − {baseline}",
                    "pairs": _count(_paired(g, base, paired, metrics), metrics),
                    **{
                        m: cell((g.loc[paired, m] - base.loc[paired, m]).to_numpy(float), rng)
                        if m in g and m in base
                        else "n/a"
                        for m in metrics
                    },
                }
            )
    return pd.DataFrame(est), pd.DataFrame(diff)


def markdown(df: pd.DataFrame) -> str:
    """A pipe table; floats in 3 decimals (pandas' to_markdown needs the optional tabulate package)."""
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


SECTIONS = {
    "Held-out accuracy (greedy exact match, step -1 → last step)": [
        "acc_start",
        "acc_mean",
        "acc_final",
        "acc_gain",
        "live_share",
        "wall_seconds",
    ],
    "Accuracy gain by difficulty (lab-add: carries; lab-kk: people)": "gain_d",
    "Final accuracy by difficulty (lab-add: carries; lab-kk: people)": "acc_d",
    "AR-Lopti premise: p < 0.25 tokens, live bucket steps": ["low_tokens", "low_update"],
    "Correct ratio by probability bucket, live bucket steps": "cr_",
    "TR-GRPO: gradient-norm stability, live steps": ["grad_cv", "spikes"],
    "Entropy, sampled accuracy, lab-kk overlooked contradictions (first / last 10 % of steps)": [
        "entropy_start",
        "entropy_end",
        "sampled_start",
        "sampled_end",
        "overlook_start",
        "overlook_end",
    ],
}


def report(df: pd.DataFrame, rules: list[str], baseline: str = "grpo", horizon: int | None = None) -> str:
    """The markdown report: one estimate table and one paired-difference table per claim (rules in order);
    `horizon`: the runs were summarised over their first N steps."""
    cut = (
        ""
        if horizon is None
        else f" Every run summarised over its first {horizon} steps (steps 0-{horizon - 1})."
    )
    parts = [
        "# Study results (written by scripts/study.py; read docs/study.md first)",
        f"Runs: {len(df)} ({', '.join(f'{r}: {n}' for r, n in df['rule'].value_counts().items())}). "
        "Cells: mean over seeds [percentile bootstrap 95 % interval over seeds]." + cut,
    ]
    for title, cols in SECTIONS.items():
        cols = cols if isinstance(cols, list) else sorted(c for c in df if c.startswith(cols))
        cols = [c for c in cols if c in df]
        if not cols:
            continue
        est, diff = summary_tables(df, cols, rules, baseline)
        paired = f"Paired difference to {baseline} (same seeds):"
        parts += [f"### {title}", markdown(est), paired, markdown(diff)]
    return "\n\n".join(parts) + "\n"
