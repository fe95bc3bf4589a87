"""Multi-digit arithmetic: "a op b" with d-digit operands (TinyZero's multiplication task, generalised).

Difficulty = operand digits d: both operands are drawn uniformly from the d-digit integers (0..9 for d=1).
Operations come from "+-*"; for "-" the larger operand goes first, so every answer is a non-negative integer.

Reward (TinyZero `multiply.py`, format_score 0.1, score 1.0), on the last <answer>...</answer>:

    0.0  no answer, or the answer is not a plain integer ("1,234", "12.0" and words do not count)
    0.1  an integer, but the wrong one
    1.0  the right integer

`think=False` asks for the bare answer instead and starts the response with "<answer>", so a small model
answers in a handful of tokens (the CPU sample runs: SmolLM2-135M rarely closes a <think> block in 40).

Usage::

    task = get_task("arithmetic", digits=(1, 2), ops="+-")
    task = get_task("arithmetic", digits=(1, 2), ops="+-", think=False)    # answer only
"""

from __future__ import annotations

import re

import numpy as np

from tokengrad.train.tasks.base import (
    Problem,
    last_answer,
    parse_int_range,
    procedural_eval,
    procedural_train,
    register_task,
)

SYSTEM = (
    "You are a helpful assistant. You first thinks about the reasoning process in the mind and then "
    "provides the user with the answer."
)
RESPONSE_PREFIX = "Ok let me think about it.\n<think>"
PROMPT = (
    "Give me the answer of the following equation: {a} {op} {b} = ? Show your work in <think> </think> "
    "tags. And return the final answer as an integer in <answer> </answer> tags, for example "
    "<answer> 17 </answer>."
)
# No worked example here: a 135M model copies an example's number as its answer.
PROMPT_DIRECT = (
    "Give me the answer of the following equation: {a} {op} {b} = ? Return only the final "
    "answer as an integer in <answer> </answer> tags."
)
PREFIX_DIRECT = "<answer>"
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAX_DIGITS = 12
_INTEGER = re.compile(r"[+-]?[0-9]+")


def score_arithmetic(response: str, answer: int) -> float:
    """TinyZero's arithmetic reward: 1.0 right integer, 0.1 wrong integer, 0.0 anything else."""
    text = last_answer(response)
    if text is None or not _INTEGER.fullmatch(text):
        return 0.0
    return 1.0 if int(text) == answer else 0.1


def sample_arithmetic(rng: np.random.Generator, digits: int, ops: str, think: bool = True) -> Problem:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    a, b = (int(x) for x in rng.integers(low, 10**digits, size=2))
    op = str(rng.choice(list(ops)))
    if op == "-" and a < b:
        a, b = b, a  # keep answers non-negative
    prompt, prefix = (PROMPT, RESPONSE_PREFIX) if think else (PROMPT_DIRECT, PREFIX_DIRECT)
    return Problem(
        prompt=prompt.format(a=a, op=op, b=b),
        answer=OPS[op](a, b),
        difficulty=str(digits),
        system=SYSTEM,
        response_prefix=prefix,
        meta={"expression": f"{a} {op} {b}"},
    )


def _key(problem: Problem) -> str:
    return f"arithmetic|{problem.meta['expression']}"


class ArithmeticTask:
    name = "arithmetic"
    tool_stop = None

    def __init__(self, digits: tuple[int, ...], ops: str, think: bool = True):
        self.levels, self.ops, self.think = digits, ops, think

    def _sample(self, rng: np.random.Generator, digits: int) -> Problem:
        return sample_arithmetic(rng, digits, self.ops, self.think)

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        return procedural_train(self._sample, _key, self.levels, n, seed)

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        """Held-out problems per digit count; the 1-digit space is small, so its set may repeat problems."""
        return procedural_eval(self._sample, _key, self.levels, n_per_difficulty, seed)

    def reward(self, problem: Problem, completion: str) -> float:
        return score_arithmetic(problem.response_prefix + completion, problem.answer)

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.reward(problem, completion) == 1.0

    def tool(self, text: str) -> str | None:
        return None


@register_task("arithmetic")
def make_arithmetic(
    digits: int | tuple[int, int] = (1, 3), ops: str = "+-*", think: bool = True
) -> ArithmeticTask:
    """Arithmetic with operands of `digits` digits (an int or inclusive range in 1..12) and operations `ops`;
    `think=False`: answer only, the response starting at "<answer>"."""
    levels = parse_int_range("digits", digits, 1, MAX_DIGITS)
    if not (isinstance(ops, str) and ops and set(ops) <= set(OPS) and len(set(ops)) == len(ops)):
        raise ValueError(
            f"ops must be a non-empty string of distinct characters from {''.join(OPS)!r}, got {ops!r}"
        )
    if not isinstance(think, bool):
        raise ValueError(f"think must be true or false, got {think!r}")
    return ArithmeticTask(levels, ops, think)
