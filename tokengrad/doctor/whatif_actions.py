"""The gradient-spike and low-probability findings' prescription, quantified where the run recorded what
the other weighting rules would have done (the `whatif` table): "tr_grpo would have made step 41's update
0.81 instead of 0.59; its p < 0.25 share 28 % instead of 66 %". On a run without what-if rows the action
says how to record them for the run's producer (the built-in trainer, TRL, a plain loop; verl records none).

    spike_action(view, step=41)        # Action, or None where nothing can be said
    dominance_action(view)             # the same pooled over the analysed steps
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.doctor.finding import Action
from tokengrad.doctor.registry import fmt, pct
from tokengrad.doctor.view import RunView
from tokengrad.read.whatif_frames import ACTUAL, bucket_share_table, norm_trajectories, step_comparison
from tokengrad.schema import WHAT

SOURCE = "tokengrad whatif table: each rule's gradient from the same parameters on the same batch"
RULES = '["lopti", "tr_grpo"]'
HOW = {  # producer (tokengrad.read.meta_file.origin) -> how to record what-if updates there
    "trainer": f"train with the config keys whatif = {RULES} and whatif_every = N",
    "trl": f"attach(trainer, dir, whatif=WhatIf(rules={RULES}, every=N))",
    "loop": f"Recorder(..., whatif=WhatIf(rules={RULES}, every=N, loss={{...}}))",
}


def _whatif(view: RunView) -> pd.DataFrame:
    w = view.run.table("whatif")
    return w if w.empty or view.upto is None else w[w[WHAT.step] <= view.upto]


def how_to_record(view: RunView) -> Action | None:
    """How this run's producer records the rules' what-if updates (None for a producer that cannot)."""
    how = HOW.get(view.settings.producer)
    if how is None:
        return None
    return Action(f"measure what another rule would have done on these very steps: {how}", SOURCE)


def _low(value: float, actual: float) -> str:
    if not (np.isfinite(value) and np.isfinite(actual)):
        return ""
    return f"; its p < 0.25 share {pct(value)} instead of {pct(actual)}"


def spike_action(view: RunView, *, step: int) -> Action | None:
    """The rules' norms (and p < 0.25 shares) at the spike step, or how to record them."""
    w = _whatif(view)
    if w.empty:
        return how_to_record(view)
    rows = step_comparison(w, view.layers, view.buckets, step=step)
    if not rows:
        every = int(view.meta.get("whatif_every") or 0)
        return Action(
            f"what-if rows exist for other steps only (every {every} steps): "
            f"re-run with whatif_every dividing {step} to see the rules at this step",
            SOURCE,
        )
    said = "; ".join(
        f"{r['rule']} would have made step {step}'s update {fmt(r['norm'])} instead of "
        f"{fmt(r['actual_norm'])}{_low(r['low_share'], r['actual_low_share'])}"
        for r in rows
    )
    return Action(said, SOURCE)


def has_rows_at(view: RunView, step: int) -> bool:
    w = _whatif(view)
    return not w.empty and bool((w[WHAT.step] == step).any())


def dominance_action(view: RunView) -> Action | None:
    """Each rule's mean p < 0.25 share (and median norm ratio) over the analysed steps, or how to record."""
    w = _whatif(view)
    if w.empty:
        return how_to_record(view)
    shares = bucket_share_table(w, view.buckets)
    low = shares[shares["lo"] < 0.25 - 1e-9].groupby("series")["update_share"].sum(min_count=1)
    norms = norm_trajectories(w, view.layers)
    actual = norms[norms.series == ACTUAL].set_index("step").grad_norm
    parts = []
    for rule in [s for s in low.index if s != ACTUAL]:
        mine = norms[norms.series == rule].set_index("step").grad_norm
        ratio = (mine / actual.reindex(mine.index)).replace([np.inf, -np.inf], np.nan).median()
        norm = f" and its update {fmt(ratio)}x the actual one (median)" if np.isfinite(ratio) else ""
        parts.append(f"{rule}: p < 0.25 share {pct(low[rule])}{_vs(low)}{norm}")
    if not parts:
        return how_to_record(view)
    n = int(shares.n_steps.max())
    return Action(f"over the {n} steps with what-if rows, " + "; ".join(parts), SOURCE)


def _vs(low: pd.Series) -> str:
    return f" instead of {pct(low[ACTUAL])}" if ACTUAL in low.index and np.isfinite(low[ACTUAL]) else ""
