"""TRL's logged metrics as step scalars: every log of the step, aggregated as the steps table defines them.

A tokengrad step (one generation batch) holds several optimizer updates when num_iterations > 1 or
steps_per_generation > gradient_accumulation_steps, and TRL logs once per `logging_steps` updates. The
step's `loss`, `kl`, `clip_frac`, `lr` and every other rate are the mean over the step's updates: each log
counts for the updates it covers (TRL's own log already averages within its window). Running totals and
counters keep the step's last value.
"""

from __future__ import annotations

import re

# TRL metric -> run-format steps column; every other numeric metric becomes `trl_<name>`.
STEP_COLUMNS = {
    "loss": "loss",
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "kl": "kl",
    "learning_rate": "lr",
    "clip_ratio/region_mean": "clip_frac",
}
LAST_VALUE = ("trl_global_step", "trl_epoch", "trl_num_tokens")  # counters: the step's last value
SUMMARY_KEYS = ("train_", "eval_", "total_flos")  # end-of-training summaries and evaluations: not a step
KEEP_NAN = ("loss",)  # a NaN here is the pathology itself (the doctor's nonfinite), never left out


def column(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(name)).strip("_")


def step_scalars(logs: dict) -> dict[str, float]:
    """The numeric metrics of one TRL log under their steps-table names."""
    return {
        STEP_COLUMNS.get(k, f"trl_{column(k)}"): float(v)
        for k, v in logs.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class StepLogs:
    """The TRL logs of one step; `add` returns the step's aggregated scalars so far."""

    def __init__(self, last_logged_step: int = 0):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.logged_step = last_logged_step  # TRL's global_step at the previous log (any step)

    def add(self, global_step: int, logs: dict) -> dict[str, float]:
        """Fold in one log made at TRL's `global_step`; the updates it covers weigh it."""
        n = max(int(global_step) - self.logged_step, 1)
        self.logged_step = int(global_step)
        scalars = dict(step_scalars(logs), trl_global_step=float(global_step))
        for k, v in scalars.items():
            if k in LAST_VALUE:
                self.last[k] = v
            elif v == v or k in KEEP_NAN:  # NaN (a metric TRL could not compute) does not dilute the mean
                self.sums[k] = self.sums.get(k, 0.0) + n * v
                self.counts[k] = self.counts.get(k, 0.0) + n
        return {**{k: self.sums[k] / self.counts[k] for k in self.sums}, **self.last}
