"""Knights & Knaves puzzles: the K&K generator (arXiv 2410.23123) and the Logic-RL task (arXiv 2502.14768).

A puzzle is a tuple of N statements, statement i being what person i says; a solution is a tuple of N bools
(True = knight, who always tells the truth; False = knave, who always lies). Statements are nested tuples:

    ("telling-truth", j)  person j is a knight        ("not", S)
    ("lying", j)          person j is a knave         ("and", S1, S2)  ("or", S1, S2)
                                                       ("->", S1, S2)   ("<=>", S1, S2)

The sampler draws from `numpy.random.default_rng(seed)` in the published generator's call order, so
`sample_puzzles(n, count, seed=1234)` followed by `format_puzzle(..., index=i, seed=1234)` regenerates the
published data byte for byte: K&K test split = list indices 0..99, K&K train = 100.. (Logic-RL's train
parquet = indices 100..999, its test parquet = 1000..1099, for N = 3..7).

Usage::

    task = get_task("kk", n_people=(2, 3))
    problems = task.train_problems(64, seed=0)
    task.reward(problems[0], "</think><answer> (1) Zoey is a knight\\n(2) Liam is a knave </answer>")
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from tokengrad.train.tasks.base import Problem, check_int, parse_int_range, register_task
from tokengrad.train.tasks.kk_format import (
    LOGIC_RL_RESPONSE_PREFIX,
    LOGIC_RL_SYSTEM,
    format_puzzle,
    score_response,
)

DEPTH = 2  # statement nesting depth of the published data (the wording supports no deeper)
WIDTH = 2  # operands of and/or
MAX_RETRY = 1000  # candidates tried per list slot before the slot is left empty
PUBLISHED_SEED = 1234
EVAL_SIZE = 100  # list indices 0..99: the published K&K test split
TRAIN_SIZE = 900  # list indices 100..999: Logic-RL's training puzzles
# Only 399 two-person puzzles have a unique solution (30 x 30 statement pairs, counted in the tests); the
# first 400 list slots yield 398 of them, and every later slot burns MAX_RETRY candidates to find at most
# one more, so two-person lists stop after 400 slots.
MAX_SLOTS = {2: 400}
LEAF_KINDS = ("telling-truth", "lying")
MAX_PEOPLE = 8  # the benchmark's range is 2..8 (and 2^8 assignments keep brute force trivial)


@dataclass(frozen=True)
class KKPuzzle:
    statements: tuple  # one nested statement tuple per person
    solution: tuple[bool, ...]  # the unique consistent assignment


# ---------------------------------------------------------------------------------------------------
# Brute-force solver: every assignment at once, as bitmasks over the 2^N assignments.
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def assignments(n: int) -> tuple[tuple[bool, ...], ...]:
    # `itertools.product` order (all knights first), so lists of solutions keep the published order.
    return tuple(itertools.product([True, False], repeat=n))


@functools.lru_cache(maxsize=None)
def _knight_masks(n: int) -> tuple[int, ...]:
    """Bit a of mask i is set when person i is a knight in assignment a."""
    masks = [0] * n
    for a, assignment in enumerate(assignments(n)):
        for i, knight in enumerate(assignment):
            masks[i] |= int(knight) << a
    return tuple(masks)


def truth_mask(stmt: tuple, knights: tuple[int, ...], full: int) -> int:
    op, args = stmt[0], stmt[1:]
    if op in ("telling-truth", "lying"):
        return knights[args[0]] if op == "telling-truth" else full ^ knights[args[0]]
    vals = [truth_mask(s, knights, full) for s in args]
    return _COMBINE[op](vals, full)


_COMBINE = {
    "not": lambda v, full: full ^ v[0],
    "and": lambda v, full: functools.reduce(int.__and__, v),
    "or": lambda v, full: functools.reduce(int.__or__, v),
    "->": lambda v, full: (full ^ v[0]) | v[1],
    "<=>": lambda v, full: full ^ (v[0] ^ v[1]),
}


def solve(statements: tuple) -> list[tuple[bool, ...]]:
    """All assignments in which every knight's statement is true and every knave's is false."""
    n = len(statements)
    knights = _knight_masks(n)
    full = (1 << (1 << n)) - 1
    consistent = full
    for i, stmt in enumerate(statements):
        consistent &= full ^ (knights[i] ^ truth_mask(stmt, knights, full))
    every, solutions = assignments(n), []
    while consistent:
        lowest = consistent & -consistent
        solutions.append(every[lowest.bit_length() - 1])
        consistent ^= lowest
    return solutions


# ---------------------------------------------------------------------------------------------------
# Sampler: the published generator's random call order, one numpy Generator for the whole list.
# ---------------------------------------------------------------------------------------------------


class _Sampler:
    def __init__(self, n_people: int, seed: int):
        self.n = n_people
        self.rng = np.random.default_rng(seed)

    def statement(self, person: int, depth: int) -> tuple:
        # The die is rolled even at depth 1, where it is ignored: the call order must stay identical.
        dice = int(self.rng.integers(0, 6))
        if depth == 1 or dice == 0:
            return self.leaf(person)
        if dice == 1:
            return ("not", self.statement(person, depth - 1))
        if dice in (2, 3):
            width = int(self.rng.integers(2, WIDTH + 1))
            return (("and", "or")[dice - 2],) + self.children(person, depth, width)
        return (("->", "<=>")[dice - 4],) + self.children(person, depth, 2)

    def leaf(self, person: int) -> tuple:
        while True:
            # The published generator calls rng.choice over the two kinds; numpy's uniform choice draws
            # integers(0, 2), so this is the same draw without choice's per-call overhead (the byte-exact
            # tests pin the equivalence).
            kind = LEAF_KINDS[int(self.rng.integers(0, 2))]
            target = int(self.rng.integers(0, self.n))
            if not (kind == "lying" and target == person):  # "I am a knave" is a paradox
                return (kind, target)

    def children(self, person: int, depth: int, count: int) -> tuple:
        out: list[tuple] = []
        while len(out) < count:
            child = self.statement(person, depth - 1)
            if child not in out:  # operands of one operator differ
                out.append(child)
        return tuple(out)

    def puzzle(self) -> tuple:
        return tuple(self.statement(p, DEPTH) for p in range(self.n))


class PuzzleList:
    """The generator's list for one (n_people, seed), grown slot by slot on demand.

    Each slot tries up to MAX_RETRY candidates, skipping repeats of earlier puzzles and puzzles with zero or
    several solutions; a slot that finds none adds nothing, as in the published generator. The sampler is
    sequential, so a list grown further always starts with the shorter one.
    """

    def __init__(self, n_people: int, seed: int = PUBLISHED_SEED):
        if not 2 <= n_people <= MAX_PEOPLE:
            raise ValueError(f"n_people must be in 2..{MAX_PEOPLE}, got {n_people}")
        self.sampler = _Sampler(n_people, seed)
        self.max_slots = MAX_SLOTS.get(n_people)
        self.seen: set[tuple] = set()
        self.puzzles: list[KKPuzzle] = []
        self.slots = 0

    def _fill_slot(self) -> None:
        self.slots += 1
        for _ in range(MAX_RETRY):
            statements = self.sampler.puzzle()
            if statements in self.seen:
                continue
            solutions = solve(statements)
            if len(solutions) == 1:
                self.seen.add(statements)
                self.puzzles.append(KKPuzzle(statements, solutions[0]))
                return

    def grow_slots(self, slots: int) -> None:
        while self.slots < slots:
            self._fill_slot()

    def grow_puzzles(self, count: int) -> None:
        """Until `count` puzzles exist or the slot cap for this size is reached."""
        while len(self.puzzles) < count and (self.max_slots is None or self.slots < self.max_slots):
            self._fill_slot()


def sample_puzzles(n_people: int, count: int, seed: int = PUBLISHED_SEED) -> list[KKPuzzle]:
    """The puzzles of the generator's first `count` slots (fewer than `count` only if a slot failed)."""
    puzzles = PuzzleList(n_people, seed)
    puzzles.grow_slots(count)
    return puzzles.puzzles


@functools.lru_cache(maxsize=32)
def _shared_list(n_people: int, seed: int) -> PuzzleList:
    return PuzzleList(n_people, seed)


def make_problem(puzzle: KKPuzzle, index: int, seed: int = PUBLISHED_SEED) -> Problem:
    """A Logic-RL problem: the quiz as user message, Logic-RL's system message and "<think>" prefix."""
    text = format_puzzle(puzzle.statements, puzzle.solution, index, seed)
    n = len(puzzle.statements)
    return Problem(
        prompt=text.quiz + "\n",
        answer=text.solution_text_format,
        difficulty=str(n),
        system=LOGIC_RL_SYSTEM,
        response_prefix=LOGIC_RL_RESPONSE_PREFIX,
        meta={
            "index": index,
            "n_people": n,
            "n_knights": sum(puzzle.solution),
            "statements": str(puzzle.statements),
        },
    )


def published_problems(n_people: int, start: int, stop: int, seed: int = PUBLISHED_SEED) -> list[Problem]:
    """List indices start..stop-1, e.g. (3, 100, 1000) is Logic-RL's 3-person training set.

    Two-person lists end after 398 puzzles (see MAX_SLOTS), so they may return fewer.
    """
    puzzles = _shared_list(n_people, seed)
    puzzles.grow_puzzles(stop)
    pool = puzzles.puzzles
    return [make_problem(pool[i], i, seed) for i in range(start, min(stop, len(pool)))]


# ---------------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------------


class KKTask:
    """Logic-RL K&K. Held-out split: list indices [0, eval_size) of each N's list (the published K&K test
    split by default); training uses indices [eval_size, eval_size + train_size). The generator never repeats
    a puzzle within a list, so the two never overlap, whatever seeds the methods are given.
    """

    name = "kk"
    tool_stop = None

    def __init__(self, n_people: tuple[int, ...], data_seed: int, eval_size: int, train_size: int):
        self.n_people, self.data_seed = n_people, data_seed
        self.eval_size, self.train_size = eval_size, train_size

    @functools.cached_property
    def _train_pool(self) -> list[Problem]:
        return [
            p
            for n in self.n_people
            for p in published_problems(n, self.eval_size, self.eval_size + self.train_size, self.data_seed)
        ]

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        """n problems drawn epoch by epoch: each pass over the training pool is a fresh permutation."""
        check_int("n", n, 0)
        pool = self._train_pool
        if not pool:
            raise ValueError(f"no training puzzles: eval_size={self.eval_size} uses up every list")
        rng = np.random.default_rng(check_int("seed", seed, 0))
        order: list[int] = []
        while len(order) < n:
            order += rng.permutation(len(pool)).tolist()
        return [pool[i] for i in order[:n]]

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        """The first n_per_difficulty held-out puzzles per N; fixed, so `seed` does not change them."""
        check_int("n_per_difficulty", n_per_difficulty, 1, self.eval_size)
        return [p for n in self.n_people for p in published_problems(n, 0, n_per_difficulty, self.data_seed)]

    def reward(self, problem: Problem, completion: str) -> float:
        return score_response(problem.response_prefix + completion, problem.answer).total

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return score_response(problem.response_prefix + completion, problem.answer).correct

    def tool(self, text: str) -> str | None:
        return None


@register_task("kk")
def make_kk(
    n_people: int | tuple[int, int] = (3, 7),
    data_seed: int = PUBLISHED_SEED,
    eval_size: int = EVAL_SIZE,
    train_size: int = TRAIN_SIZE,
) -> KKTask:
    """K&K with N people, N an int or an inclusive (lo, hi) range within 2..8.

    The defaults give Logic-RL's training mix (900 puzzles for each N = 3..7) and the K&K test split.
    """
    people = parse_int_range("n_people", n_people, 2, MAX_PEOPLE)
    return KKTask(
        people,
        check_int("data_seed", data_seed, 0),
        check_int("eval_size", eval_size, 1),
        check_int("train_size", train_size, 1),
    )
