"""A task a tiny random model can learn in a few steps: write characters of one class.

    task = get_task("charset", classes=("lower", "digit"))

The prompt names a character class; the reward is the share of the completion's characters in that class
(0 for an empty completion), so even a random byte-level model's completions spread over [0, 1] and every
group has non-zero advantages. Difficulty = the class. A completion is correct when more than half of its
characters are in the class. Made for demos and tests of the training pipeline (configs/tiny_*.toml), not
as a benchmark.
"""

from __future__ import annotations

import numpy as np

from tokengrad.train.tasks.base import Problem, register_task

CLASSES = {
    "lower": ("lowercase letters", lambda c: c.isascii() and c.islower()),
    "upper": ("uppercase letters", lambda c: c.isascii() and c.isupper()),
    "digit": ("digits", lambda c: c.isascii() and c.isdigit()),
    "space": ("spaces", lambda c: c == " "),
}
PROMPT = "Reply with {n} {what} and nothing else."
EVAL_OFFSET = 1_000_003  # eval problems come from another seed stream than training problems


class CharsetTask:
    name = "charset"
    tool_stop = None

    def __init__(self, classes: tuple[str, ...] | list[str] = ("lower", "digit")):
        unknown = sorted(set(classes) - set(CLASSES))
        if unknown or not classes:
            raise ValueError(
                f"charset classes must be a non-empty subset of {sorted(CLASSES)}, got {classes}"
            )
        self.classes = tuple(classes)

    def _problem(self, rng: np.random.Generator, cls: str) -> Problem:
        n = int(rng.integers(4, 13))
        return Problem(PROMPT.format(n=n, what=CLASSES[cls][0]), cls, cls, meta={"n_chars": n})

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = np.random.default_rng(seed)
        return [self._problem(rng, self.classes[int(rng.integers(len(self.classes)))]) for _ in range(n)]

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        rng = np.random.default_rng(seed + EVAL_OFFSET)
        return [self._problem(rng, cls) for cls in self.classes for _ in range(n_per_difficulty)]

    def reward(self, problem: Problem, completion: str) -> float:
        in_class = CLASSES[problem.answer][1]
        return sum(map(in_class, completion)) / len(completion) if completion else 0.0

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.reward(problem, completion) > 0.5

    def tool(self, text: str) -> str | None:
        return None


@register_task("charset")
def make_charset(classes: tuple[str, ...] | list[str] = ("lower", "digit")) -> CharsetTask:
    return CharsetTask(classes)
