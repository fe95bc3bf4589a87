"""The run as the detectors see it: one row per step, the samples, buckets and token queries (read/ only).

    view = RunView.open("runs/demo")            # or RunView(load_run(...), upto=120) for a live prefix
    view.steps                                  # steps table, one row per step (ranks merged)
    view.column("entropy_mean")                 # (steps, values) of a steps column; None when not recorded
    view.sql("SELECT ... FROM tokens WHERE step = ?", [142])
    view.settings.max_new_tokens                # the run's settings, whatever recorded it (settings.py)
    view.need("kl")                             # a column, or NotChecked("the run records no kl")
    view.has_token_columns("masked", "masked_by")   # the tokens table has these columns

Detectors name every column through tokengrad.schema (`view.need(STEP.kl)`, f"SELECT {TOK.prob} ..."), so
a renamed column fails tests/doctor/test_doctor_columns.py instead of silently turning a detector off.

Every table is cut at `upto` (the last committed step the live doctor has seen), so a detector looking at a
running run sees exactly the steps written so far.
"""

from __future__ import annotations

import os
from functools import cached_property

import numpy as np
import pandas as pd

from tokengrad.doctor.finding import NotChecked
from tokengrad.doctor.settings import RunSettings, settings_of
from tokengrad.read.runs import Run, load_run
from tokengrad.read.unreadable import RunLosses, run_losses
from tokengrad.schema import STEP, TOK

# ranks of one step merge by: a sum for counts and times, a max for the gradient norm, else the mean
_SUMMED = {STEP.n_tokens, STEP.n_nonfinite, STEP.n_token_rows, STEP.groups_generated, STEP.groups_kept}
_MAXED = {STEP.grad_norm, STEP.ds_grad_norm, STEP.time_step, STEP.time_record, STEP.weight_max}


class RunView:
    def __init__(self, run: Run, upto: int | None = None):
        self.run = run
        self.upto = upto

    @classmethod
    def open(cls, path: str | os.PathLike, upto: int | None = None) -> RunView:
        return cls(load_run(path), upto)

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def meta(self) -> dict:
        return self.run.meta

    @property
    def config(self) -> dict:
        cfg = self.meta.get("config")
        return cfg if isinstance(cfg, dict) else {}

    @cached_property
    def settings(self) -> RunSettings:
        """The run's training settings in one shape, whichever producer wrote it (doctor/settings.py)."""
        return settings_of(self.meta)

    def _cut(self, df: pd.DataFrame) -> pd.DataFrame:
        if self.upto is None or df.empty or STEP.step not in df.columns:  # every table's key: step, rank
            return df
        return df[df[STEP.step] <= self.upto].reset_index(drop=True)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per step: the ranks' rows merged (sums of counts, max of norms and times, else means)."""
        df = self._cut(self.run.steps)
        if df.empty or self.meta.get("world_size", 1) in (None, 1):
            return df.drop_duplicates(STEP.step, keep="last").reset_index(drop=True) if not df.empty else df
        numeric = [c for c in df.select_dtypes("number").columns if c not in (STEP.step, STEP.rank)]
        how = {c: "sum" if c in _SUMMED else "max" if c in _MAXED else "mean" for c in numeric}
        return df.groupby(STEP.step, as_index=False).agg(how)

    @cached_property
    def samples(self) -> pd.DataFrame:
        return self._cut(self.run.samples)

    @cached_property
    def buckets(self) -> pd.DataFrame:
        return self._cut(self.run.buckets)

    @cached_property
    def layers(self) -> pd.DataFrame:
        return self._cut(self.run.layers)

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(steps, values) of a steps-table column over the steps that recorded it; None when no step did."""
        df = self.steps
        if df.empty or name not in df.columns:
            return None
        values = pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)
        keep = ~np.isnan(values)
        if not keep.any():
            return None
        return df[STEP.step].to_numpy()[keep].astype(int), values[keep]

    def need(self, name: str, what: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`column(name)`, or NotChecked naming it when no step recorded it (`what`: the words for it)."""
        col = self.column(name)
        if col is None:
            raise NotChecked(f"the run records no {what or name}" + (f" ({name})" if what else ""))
        return col

    @cached_property
    def losses(self) -> RunLosses:
        """What the run's reads lack: unreadable files and missing rank folders (tokengrad.read.unreadable);
        every table's footers are checked for it once per view."""
        return run_losses(self.run)

    @cached_property
    def has_tokens(self) -> bool:
        return bool(self.run.files("tokens"))

    def step_cut(self, where: str = "WHERE") -> str:
        """The live doctor's step cut for a steps or samples query ('' without `upto`; `sql` cuts tokens
        itself): `where` is the keyword that joins it ("WHERE" or "AND")."""
        return "" if self.upto is None else f" {where} {STEP.step} <= {int(self.upto)}"

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        """A DuckDB query over the run's tables; `tokens` is cut at `upto` like the other tables."""
        if self.upto is not None:
            query = query.replace(
                "FROM tokens", f"FROM (SELECT * FROM tokens WHERE {TOK.step} <= {int(self.upto)})"
            )
        return self.run.sql(query, params)

    def token_columns(self) -> frozenset[str]:
        """Columns of the tokens view (asked of DuckDB once per view, like has_tokens)."""
        return self._token_columns

    def has_token_columns(self, *names: str) -> bool:
        """Whether the tokens view has every one of `names` (False for a run without token rows)."""
        return set(names) <= self._token_columns

    @cached_property
    def _token_columns(self) -> frozenset[str]:
        if not self.has_tokens:
            return frozenset()
        return frozenset(self.run.sql("SELECT * FROM tokens LIMIT 0").columns)
