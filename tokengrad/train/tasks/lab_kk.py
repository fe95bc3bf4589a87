"""Compact Knights & Knaves with a plain-word reasoning trace, for the CPU lab model `lab-kk`.

Puzzles come from the project's K&K generator and solver (tokengrad.train.tasks.kk), with people named
A..E and statements in the benchmark's own wording (kk_format.render_statement); 2..5 people,
difficulty = number of people. No instructions, no chat template:

    prompt      A says C is a knight . B says A is a knave . C says If A is a knave then B is a knight .
    completion  try knight knight knight B lies try knight knight knave A lies try knight knave knight
                ok so A knight B knave C knight

The completion tries assignments in the solver's order (all knights first, person A slowest), each
written as its roles in person order, and names the first person whose statement contradicts it: "B lies"
(a knight whose statement is false) or "C truthful" (a knave whose statement is true); the first assignment
with no contradiction is marked "ok" and given as the answer after "so".

The sloppy teacher (`teacher`, the lab model's supervised targets) overlooks a *lone* contradiction
(an assignment that only one person's statement contradicts) with probability q: it writes "ok" and gives
that wrong assignment as its answer. Assignments two or more statements contradict are always rejected.
A model that fits the teacher with q > 0.5 accepts the first lone-contradiction assignment when decoding
greedily and gets a puzzle right when sampling with probability (1 - q)**k, k = lone-contradiction
assignments before the solution (k is 0..2 on most 3- and 4-person puzzles): SFT plateaus, and only a
reward for the right answer can teach it to name every contradiction.

Reward: exact match, 1.0 when the words after the completion's last "so" are the answer
("A knight B knave C knight"), else 0.0 (no "so": 0.0).

    task = get_task("lab_kk", n_people=(3, 4), eval_people=(2, 5))
"""

from __future__ import annotations

import ast
import functools

import numpy as np

from tokengrad.train.tasks.base import (
    TRAIN_STREAM,
    Problem,
    check_int,
    is_held_out,
    parse_int_range,
    register_task,
)
from tokengrad.train.tasks.kk import PuzzleList, _assignments, _knight_masks, _truth_mask
from tokengrad.train.tasks.kk_format import render_statement

NAMES = ("A", "B", "C", "D", "E")
MAX_PEOPLE = len(NAMES)
ROLE = {True: "knight", False: "knave"}
# a knight whose statement is false lies; a knave whose statement is true is (wrongly) truthful
VERDICT = {True: "lies", False: "truthful"}
TRACE_WORDS = ("try", "lies", "truthful", "ok", "so")
DATA_SEED = 4321  # not the published seed 1234: these puzzles are the lab's own
TRAIN_POOL = 10_000  # distinct training puzzles per people count (2 people: all ~360 there are)
# Two-person lists hold only ~399 distinct puzzles (kk.MAX_SLOTS); held-out ones then repeat in order.
SLOT_CAP = {2: 400}


def consistency(statements: tuple) -> list[list[int]]:
    """For each assignment in the solver's order, the people whose statement contradicts it (in order).

    The solver's bitmasks: bit a of `bad[i]` is set when person i's statement contradicts assignment a.
    """
    n = len(statements)
    knights, full = _knight_masks(n), (1 << (1 << n)) - 1
    bad = [knights[i] ^ _truth_mask(s, knights, full) for i, s in enumerate(statements)]
    return [[i for i in range(n) if bad[i] >> a & 1] for a in range(1 << n)]


def _roles(assignment: tuple[bool, ...]) -> str:
    return " ".join(ROLE[k] for k in assignment)


def answer_text(assignment: tuple[bool, ...]) -> str:
    """(True, False) -> 'A knight B knave'."""
    return " ".join(f"{NAMES[i]} {ROLE[k]}" for i, k in enumerate(assignment))


def trace(statements: tuple, q: float = 0.0, rng: np.random.Generator | None = None) -> str:
    """The teacher's completion: assignments tried in order until one is accepted, then the answer.

    q: probability of overlooking a lone contradiction (accepting that wrong assignment); needs `rng`.
    """
    parts = []
    for assignment, bad in zip(_assignments(len(statements)), consistency(statements)):
        overlooked = len(bad) == 1 and q > 0 and rng.random() < q
        if not bad or overlooked:
            return " ".join(parts + [f"try {_roles(assignment)} ok so {answer_text(assignment)}"])
        first = bad[0]
        parts.append(f"try {_roles(assignment)} {NAMES[first]} {VERDICT[assignment[first]]}")
    raise ValueError("the puzzle has no consistent assignment")


def final_answer(completion: str) -> str | None:
    """The words after the last 'so', space-joined; None when there is no 'so'."""
    words = completion.split()
    if "so" not in words:
        return None
    last = len(words) - 1 - words[::-1].index("so")
    return " ".join(words[last + 1 :])


def render_prompt_text(statements: tuple) -> str:
    """'A says B is a knave . B says ...' (words and the full stop separated by spaces)."""
    names = NAMES[: len(statements)]
    return " ".join(f"{names[i]} says {render_statement(s, names)} ." for i, s in enumerate(statements))


def _problem(statements: tuple, solution: tuple[bool, ...]) -> Problem:
    return Problem(
        prompt=render_prompt_text(statements),
        answer=answer_text(solution),
        difficulty=str(len(statements)),
        meta={"n_people": len(statements), "n_knights": sum(solution), "statements": str(statements)},
    )


def _key(statements: tuple) -> str:
    return f"lab_kk|{statements}"


@functools.lru_cache(maxsize=16)
def _split(n_people: int, held_out: bool, count: int, data_seed: int) -> tuple:
    """The first `count` (statements, solution) pairs on one side of `is_held_out` in the generator's
    list for (n_people, data_seed); fewer when the list runs out (two people)."""
    puzzles, out, used = PuzzleList(n_people, data_seed), [], 0
    cap = SLOT_CAP.get(n_people)
    while len(out) < count and (cap is None or puzzles.slots < cap):
        puzzles.grow_slots(puzzles.slots + 256)
        for p in puzzles.puzzles[used:]:
            if is_held_out(_key(p.statements)) == held_out and len(out) < count:
                out.append((p.statements, p.solution))
        used = len(puzzles.puzzles)
    return tuple(out)


class LabKKTask:
    """Training problems: `n_people` counts drawn uniformly, puzzles uniform from each count's training
    pool. Held-out problems: the first n per count of `eval_people`, fixed (seed-independent). The two
    sides never overlap (split by a stable hash of the statements)."""

    name = "lab_kk"
    tool_stop = None

    def __init__(
        self, n_people: tuple[int, ...], eval_people: tuple[int, ...], data_seed: int, train_pool: int
    ):
        self.n_people, self.eval_people, self.data_seed = n_people, eval_people, data_seed
        self.train_pool = train_pool

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        check_int("n", n, 0)
        rng = np.random.default_rng([check_int("seed", seed, 0), TRAIN_STREAM])
        pools = {k: _split(k, False, self.train_pool, self.data_seed) for k in self.n_people}
        out = []
        for _ in range(n):
            pool = pools[int(rng.choice(self.n_people))]
            out.append(_problem(*pool[int(rng.integers(len(pool)))]))
        return out

    def eval_problems(self, n_per_difficulty: int, seed: int) -> list[Problem]:
        check_int("n_per_difficulty", n_per_difficulty, 1)
        check_int("seed", seed, 0)
        out = []
        for k in self.eval_people:
            pool = _split(k, True, n_per_difficulty, self.data_seed)
            out += [_problem(*pool[i % len(pool)]) for i in range(n_per_difficulty)]
        return out

    def teacher(self, problem: Problem, q: float, rng: np.random.Generator) -> str:
        """The sloppy teacher's completion for `problem` (see `trace`)."""
        return trace(ast.literal_eval(problem.meta["statements"]), q, rng)

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if final_answer(completion) == problem.answer else 0.0

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.reward(problem, completion) == 1.0

    def tool(self, text: str) -> str | None:
        return None


@register_task("lab_kk")
def make_lab_kk(
    n_people: int | tuple[int, int] = (3, 4),
    eval_people: int | tuple[int, int] | None = None,
    data_seed: int = DATA_SEED,
    train_pool: int = TRAIN_POOL,
) -> LabKKTask:
    """Compact K&K with a reasoning trace; `n_people` (2..5, int or range) for training, `eval_people`
    (default: the same) for held-out evaluation; difficulty = number of people; `train_pool` distinct
    training puzzles per people count."""
    train = parse_int_range("n_people", n_people, 2, MAX_PEOPLE)
    held = parse_int_range("eval_people", eval_people, 2, MAX_PEOPLE) if eval_people is not None else train
    return LabKKTask(
        train, held, check_int("data_seed", data_seed, 0), check_int("train_pool", train_pool, 1)
    )
