"""Steps without a gradient, by cause, and the closing line of a run that reports them.

A step updates nothing when every group scored alike (tied rewards: each group-relative advantage is 0,
GRPO arXiv 2402.03300; the case DAPO's dynamic sampling removes, arXiv 2503.14476 Sec. 3.2), or when it
had advantages but every token was clipped or weighted 0. The doctor's `dead_steps` detector reads the same
grad_norm == 0 from the steps table; this count is the trainer's own last line.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from tokengrad.objective.advantages import keep_groups
from tokengrad.train.sampling import scored


class DeadSteps:
    """The count of steps whose update had no gradient: `tied` (tied rewards) and `other`."""

    def __init__(self) -> None:
        self.tied = 0
        self.other = 0

    def count(self, logged: dict, scores: Tensor) -> None:
        """Counts the step if its logged grad_norm is 0 or absent (no update). `scores`: the step's
        [R B, G, 3] (reward, correct, length) of every generated group (tokengrad.train.sampling.Gathered)."""
        if logged.get("grad_norm"):
            return
        if keep_groups(scored(scores[..., 0])).any():
            self.other += 1
        else:
            self.tied += 1

    def closing_line(self, n_steps: int, run_dir: Path) -> str:
        """How many steps ran and how many had no gradient, and why."""
        line = f"tokengrad: {n_steps} steps, {self.tied + self.other} with zero gradient"
        if self.tied:
            line += f" ({self.tied} with tied rewards: every group scored alike, so every advantage is 0)"
        if self.other:
            line += f" ({self.other} with advantages but no gradient: every token clipped or weighted 0)"
        return line + f"; run in {run_dir}"
