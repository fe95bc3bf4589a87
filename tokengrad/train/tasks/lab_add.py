"""Compact multi-digit addition for the CPU lab model: ``1 2 3 4 + 5 6 7 8 =`` -> ``6 9 1 2``.

Digits are separate words, so a word-level tokenizer (tokengrad.train.lab) gives every digit one token
and the answer cannot be guessed: 4-digit operands have about 18,000 possible sums. The prompt has no
instructions and no chat template; the model answers with the digits of the sum, most significant first,
then end-of-sequence.

Difficulty = the number of carries of the column-wise addition (0..digits), the quantity the lab's
"sloppy-carry teacher" gets wrong (`sloppy_sum`): both training and held-out problems are drawn balanced
over carry counts (rejection sampling of uniform operands), so accuracy by difficulty has every level.

Reward: exact match, 1.0 when the completion (whitespace-normalised) is the sum's digit string, else 0.0.

    task = get_task("lab_add", digits=4)
    task.train_problems(64, seed=0)[0].prompt      # '3 0 7 1 + 5 9 4 4 ='
"""

from __future__ import annotations

import numpy as np

from tokengrad.train.tasks.base import Problem, check_int, procedural_eval, procedural_train, register_task

MAX_DIGITS = 8


def spaced(n: int) -> str:
    """1234 -> '1 2 3 4' (digits as words)."""
    return " ".join(str(n))


def column_carries(a: int, b: int) -> list[bool]:
    """Carry out of each column of a + b, least significant column first."""
    out, carry = [], 0
    while a or b:
        carry = int((a % 10 + b % 10 + carry) >= 10)
        out.append(bool(carry))
        a, b = a // 10, b // 10
    return out


def sloppy_sum(a: int, b: int, drop: float, rng: np.random.Generator) -> int:
    """a + b written column by column where each carry is forgotten with probability `drop`.

    The "sloppy-carry teacher" of the lab model's supervised warm start: with drop 0.5 a model that fits
    the teacher exactly solves a problem with c carries with probability 0.5**c when sampling, so SFT
    plateaus at partial competence and only a reward for the exact sum can teach it to always carry.
    """
    digits, carry, place = 0, 0, 1
    while a or b or carry:
        s = a % 10 + b % 10 + carry
        digits += (s % 10) * place
        carry = int(s >= 10)
        if carry and rng.random() < drop:
            carry = 0  # the teacher forgets this carry
        a, b, place = a // 10, b // 10, place * 10
    return digits


def _sample(rng: np.random.Generator, digits: int, carries: int) -> Problem:
    """Uniform `digits`-digit operands conditioned on exactly `carries` carries (rejection sampling)."""
    low, high = 10 ** (digits - 1), 10**digits
    while True:
        a, b = (int(x) for x in rng.integers(low, high, size=2))
        if sum(column_carries(a, b)) == carries:
            return Problem(
                prompt=f"{spaced(a)} + {spaced(b)} =",
                answer=spaced(a + b),
                difficulty=str(carries),
                meta={"a": a, "b": b, "carries": carries},
            )


def _key(problem: Problem) -> str:
    return f"lab_add|{problem.meta['a']}+{problem.meta['b']}"


class LabAddTask:
    name = "lab_add"
    tool_stop = None

    def __init__(self, digits: int):
        self.digits = digits
        self.levels = tuple(range(digits + 1))  # carry counts 0..digits

    def _sample(self, rng: np.random.Generator, carries: int) -> Problem:
        return _sample(rng, self.digits, carries)

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        return procedural_train(self._sample, _key, self.levels, n, seed)

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        return procedural_eval(self._sample, _key, self.levels, n_per_difficulty, seed)

    def teacher(self, problem: Problem, drop: float, rng: np.random.Generator) -> str:
        """The sloppy-carry teacher's target completion for `problem` (see `sloppy_sum`)."""
        return spaced(sloppy_sum(problem.meta["a"], problem.meta["b"], drop, rng))

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if " ".join(completion.split()) == problem.answer else 0.0

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.reward(problem, completion) == 1.0

    def tool(self, text: str) -> str | None:
        return None


@register_task("lab_add")
def make_lab_add(digits: int = 4) -> LabAddTask:
    """Compact addition of two `digits`-digit operands (2..8); difficulty = number of carries."""
    return LabAddTask(check_int("digits", digits, 2, MAX_DIGITS))
