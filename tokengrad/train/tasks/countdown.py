"""Countdown: combine the given numbers with + - * / to hit a target (TinyZero's task and reward).

Problems are built backwards so that every one is solvable: draw the numbers, then combine random pairs with
random operations (intermediate results stay positive integers) until one value is left; that value becomes
the target and the expression is kept as a witness. Difficulty = how many numbers.

Reward (TinyZero `countdown.py`, format_score 0.1, score 1.0):

    0.0  no <answer>...</answer> in the response
    0.1  the answer does not use every given number exactly once, is not a + - * / ( ) expression,
         or does not evaluate to the target
    1.0  it does

TinyZero scores only the response's last line; here the last answer anywhere in the response counts unless
`last_line_only=True`. Expressions are evaluated exactly (fractions) by a small AST walker instead of
Python's eval, so // and ** are rejected rather than computed.

Usage::

    task = get_task("countdown", n_numbers=(3, 4))
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

import numpy as np

from tokengrad.train.tasks.base import (
    Problem,
    check_int,
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
RESPONSE_PREFIX = "Let me solve this step by step.\n<think>"
PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
    "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 "
    "</answer>."
)
MAX_ATTEMPTS = 10_000
MAX_EXPRESSION_CHARS = 500  # longer answers are not worth parsing (and deep nesting could recurse)

# ---------------------------------------------------------------------------------------------------
# Exact evaluation of + - * / expressions
# ---------------------------------------------------------------------------------------------------

_ALLOWED_CHARS = re.compile(r"[0-9+\-*/().\s]+")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval_node(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def evaluate(expression: str) -> Fraction | None:
    """Exact value of an expression over integers with + - * / and parentheses; None if invalid."""
    if len(expression) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(expression):
        return None
    try:
        return _eval_node(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def score_countdown(
    response: str, target: int, numbers: tuple[int, ...], last_line_only: bool = False
) -> float:
    """TinyZero's Countdown reward: 1.0 correct, 0.1 answered but wrong, 0.0 no answer."""
    expression = last_answer(response.split("\n")[-1] if last_line_only else response)
    if expression is None:
        return 0.0
    if sorted(int(x) for x in re.findall(r"[0-9]+", expression)) != sorted(numbers):
        return 0.1
    value = evaluate(expression)
    return 1.0 if value is not None and value == target else 0.1


# ---------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------


def _combine(a: int, b: int, op: str) -> int | None:
    """Positive integer result of a op b (a >= b), or None when the step would leave the integers."""
    result = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if a % b == 0 else 0}[op]
    return result if result > 0 else None


def _random_expression(rng: np.random.Generator, numbers: list[int]) -> tuple[int, str] | None:
    """Fold the numbers into one value by random pairwise steps; (value, expression) or None."""
    items = [(n, str(n)) for n in numbers]
    while len(items) > 1:
        i, j = (int(x) for x in rng.choice(len(items), size=2, replace=False))
        (a, ea), (b, eb) = sorted([items[i], items[j]], key=lambda item: -item[0])
        op = str(rng.choice(["+", "-", "*", "/"]))
        value = _combine(a, b, op)
        if value is None:
            return None
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
    value, expression = items[0]
    return value, expression[1:-1] if len(numbers) > 1 else expression


def sample_countdown(rng: np.random.Generator, n_numbers: int, max_number: int, max_target: int) -> Problem:
    """One solvable problem: n_numbers integers in [1, max_number] and a target in [1, max_target]."""
    for _ in range(MAX_ATTEMPTS):
        numbers = [int(x) for x in rng.integers(1, max_number + 1, size=n_numbers)]
        built = _random_expression(rng, numbers)
        if built is not None and built[0] <= max_target:
            target, witness = built
            return Problem(
                prompt=PROMPT.format(numbers=numbers, target=target),
                answer={"target": target, "numbers": tuple(numbers)},
                difficulty=str(n_numbers),
                system=SYSTEM,
                response_prefix=RESPONSE_PREFIX,
                meta={"target": target, "numbers": " ".join(map(str, numbers)), "witness": witness},
            )
    raise ValueError(
        f"no countdown problem with {n_numbers} numbers <= {max_number} reaches a target "
        f"<= {max_target} in {MAX_ATTEMPTS} attempts; raise max_target"
    )


def _key(problem: Problem) -> str:
    return f"countdown|{sorted(problem.answer['numbers'])}|{problem.answer['target']}"


class CountdownTask:
    name = "countdown"
    tool_stop = None

    def __init__(self, n_numbers: tuple[int, ...], max_number: int, max_target: int, last_line_only: bool):
        self.levels, self.max_number, self.max_target = n_numbers, max_number, max_target
        self.last_line_only = last_line_only

    def _sample(self, rng: np.random.Generator, n_numbers: int) -> Problem:
        return sample_countdown(rng, n_numbers, self.max_number, self.max_target)

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        return procedural_train(self._sample, _key, self.levels, n, seed)

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        return procedural_eval(self._sample, _key, self.levels, n_per_difficulty, seed)

    def reward(self, problem: Problem, completion: str) -> float:
        answer = problem.answer
        return score_countdown(
            problem.response_prefix + completion, answer["target"], answer["numbers"], self.last_line_only
        )

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.reward(problem, completion) == 1.0

    def tool(self, text: str) -> str | None:
        return None


@register_task("countdown")
def make_countdown(
    n_numbers: int | tuple[int, int] = (3, 4),
    max_number: int = 99,
    max_target: int = 100,
    last_line_only: bool = False,
) -> CountdownTask:
    """Countdown with n_numbers (an int or inclusive range in 2..6) numbers from 1..max_number."""
    levels = parse_int_range("n_numbers", n_numbers, 2, 6)
    return CountdownTask(
        levels,
        check_int("max_number", max_number, 1, 10_000),
        check_int("max_target", max_target, 1),
        bool(last_line_only),
    )
