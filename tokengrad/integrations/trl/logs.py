"""TRL's logged metrics, joined to the step where TRL logs them (step_values.py gives every step its own
loss, rewards, lr, kl and clip share; TRL's log dictionary adds what only TRL measures).

TRL logs once per `logging_steps` optimizer updates (default 10; or per epoch, or never), each log the
mean over the updates since the previous one. Every numeric metric of a log becomes `trl_<name>` on the
step holding the update TRL logged at (`trl_loss`, `trl_reward`, `trl_learning_rate`, `trl_grad_norm`,
`trl_completions_clipped_ratio`, ...); several logs in one step are averaged, each weighted by the updates
it covers. Which steps a row's `trl_*` values describe: `trl_log_updates` optimizer updates ending at
TRL's step `trl_log_global_step`, the first of them in tokengrad step `trl_log_from_step`. Counters keep
the step's last value.
"""

from __future__ import annotations

import re

LAST_VALUE = ("trl_epoch", "trl_num_tokens", "trl_log_global_step")  # counters: the step's last value
SUMMARY_KEYS = ("train_", "eval_", "total_flos")  # end-of-training summaries and evaluations: not a step


def column(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(name)).strip("_")


def step_scalars(logs: dict) -> dict[str, float]:
    """The numeric metrics of one TRL log under their steps-table names (`trl_` + the name)."""
    return {
        f"trl_{column(k)}": float(v)
        for k, v in logs.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class UpdateSteps:
    """The tokengrad step each optimizer update ended in, kept until a TRL log covers the update."""

    def __init__(self):
        self.step_of: dict[int, int] = {}

    def ended(self, global_step: int, step: int) -> None:
        self.step_of[int(global_step)] = int(step)

    def first_step(self, first_update: int, last_update: int) -> int | None:
        """The step of the first update in first_update..last_update; forgets the updates up to the last."""
        covered = [s for u, s in self.step_of.items() if first_update <= u <= last_update]
        self.step_of = {u: s for u, s in self.step_of.items() if u > last_update}
        return min(covered) if covered else None


class StepLogs:
    """The TRL logs of one step; `add` returns the step's aggregated scalars so far."""

    def __init__(self, last_logged_step: int = 0, updates: UpdateSteps | None = None):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.logged_step = last_logged_step  # TRL's global_step at the previous log (any step)
        self.updates = updates if updates is not None else UpdateSteps()
        self.covered = 0  # optimizer updates the step's logs cover
        self.from_step: int | None = None

    def add(self, global_step: int, logs: dict) -> dict[str, float]:
        """Fold in one log made at TRL's `global_step`; the updates it covers weigh it."""
        n = max(int(global_step) - self.logged_step, 1)
        first = self.updates.first_step(self.logged_step + 1, int(global_step))
        self.logged_step = int(global_step)
        self.covered += n
        if first is not None and (self.from_step is None or first < self.from_step):
            self.from_step = first
        scalars = dict(step_scalars(logs), trl_log_global_step=float(global_step))
        for k, v in scalars.items():
            if k in LAST_VALUE:
                self.last[k] = v
            elif v == v:  # NaN (a metric TRL could not compute) does not dilute the mean
                self.sums[k] = self.sums.get(k, 0.0) + n * v
                self.counts[k] = self.counts.get(k, 0.0) + n
        out = {**{k: self.sums[k] / self.counts[k] for k in self.sums}, **self.last}
        out["trl_log_updates"] = float(self.covered)
        if self.from_step is not None:
            out["trl_log_from_step"] = float(self.from_step)
        return out
