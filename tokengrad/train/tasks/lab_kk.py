"""Compact Knights & Knaves with a plain-word reasoning trace, for the CPU lab model `lab-kk`.

Puzzles come from the project's K&K generator and solver (tokengrad.train.tasks.kk), with people named
A..E and statements in the benchmark's own wording (kk_format.render_statement); 2..5 people,
difficulty = number of people. No instructions, no chat template:

    prompt      A says C is a knight . B says A is a knave . C says If A is a knave then B is a knight .
    completion  try A knight B knight C knight A knight says knight C knight yes true ok
                B knight says knave A knight no false lies try A knight B knight C knave ...
                try A knight B knave C knight ... C knight says if knave A knight no then knight B knave no
                true ok so A knight B knave C knight

The completion tries assignments in the solver's order (all knights first, person A slowest) and checks
each person in turn: the speaker and the role tried, the statement restated claim by claim (the role
claimed, the person, the role tried, "yes" or "no"), the statement's truth ("true" or "false"), and the
verdict: "ok", "lies" (a knight whose statement is false) or "truthful" (a knave whose statement is true).
A contradiction ends the try; a try whose every check says ok is the answer, after "so". Every name in a
completion is followed by the role the current try gives that person, and every word is one lookup or one
comparison away from words already written: a small model can learn to check.

The sloppy teacher (`teacher`, the lab model's supervised targets) overlooks each contradiction with
probability q: it writes "ok" and checks on, and a try whose contradictions were all overlooked becomes its
(wrong) answer. The claims and truths it writes are always right; only the verdict after a contradiction
is random. A model that fits it with q > 0.5 accepts the first try when decoding greedily, and samples the
right answer with probability prod over rejected tries of (1 - q**k), k = the try's contradictions: SFT
plateaus (0.44 / 0.28 / 0.19 at 2 / 3 / 4 people for q = 0.6), and only a reward for the right answer can
teach it to act on the "false" it has just written.

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
from tokengrad.train.tasks.kk import PuzzleList, assignments, truth_mask
from tokengrad.train.tasks.kk_format import LEAF_ROLE, render_statement

NAMES = ("A", "B", "C", "D", "E")
MAX_PEOPLE = len(NAMES)
ROLE = {True: "knight", False: "knave"}
# a knight whose statement is false lies; a knave whose statement is true is (wrongly) truthful
VERDICT = {True: "lies", False: "truthful"}
YES = {True: "yes", False: "no"}  # a claim's truth under the try
TRUTH = {True: "true", False: "false"}  # a statement's truth under the try
# how a trace restates an operator over its claims (kk statements of depth <= 2 combine only leaves)
OP_WORDS = {"not": "not {}", "and": "{} and {}", "or": "{} or {}", "->": "if {} then {}", "<=>": "{} iff {}"}
TRACE_WORDS = ("try", "says", "yes", "no", "true", "false", "iff", "lies", "truthful", "ok", "so")
DATA_SEED = 4321  # not the published seed 1234: these puzzles are the lab's own
TRAIN_POOL = 10_000  # distinct training puzzles per people count (2 people: all ~360 there are)
# Two-person lists hold only ~399 distinct puzzles (kk.MAX_SLOTS); held-out ones then repeat in order.
SLOT_CAP = {2: 400}


def answer_text(assignment: tuple[bool, ...]) -> str:
    """(True, False) -> 'A knight B knave'."""
    return " ".join(f"{NAMES[i]} {ROLE[k]}" for i, k in enumerate(assignment))


def holds(stmt: tuple, assignment: tuple[bool, ...]) -> bool:
    """Whether a statement is true under one assignment (the solver's truth masks on one column)."""
    return bool(truth_mask(stmt, tuple(int(k) for k in assignment), 1))


def _claim(leaf: tuple, assignment: tuple[bool, ...]) -> str:
    """'knave A knight no': the role claimed, the person, the role the try gives them, the claim's truth.

    Every name in a trace is followed by the role the current try gives that person, so the truth of a
    claim needs one lookup (the word after the name's last occurrence) and one comparison."""
    claimed, person = LEAF_ROLE[leaf[0]], leaf[1]
    actual = assignment[person]
    return f"{ROLE[claimed]} {NAMES[person]} {ROLE[actual]} {YES[claimed == actual]}"


def restate(stmt: tuple, assignment: tuple[bool, ...]) -> str:
    """A statement restated claim by claim under one assignment: 'if knave A knight no then ...'."""
    op, args = stmt[0], stmt[1:]
    if op in LEAF_ROLE:
        return _claim(stmt, assignment)
    return OP_WORDS[op].format(*(_claim(leaf, assignment) for leaf in args))


def check(person: int, statements: tuple, assignment: tuple[bool, ...], verdict: str) -> str:
    """One check: 'B knight says knave A knight no false lies' (speaker, role, restated statement, its
    truth, and the verdict: ok, lies or truthful)."""
    stmt = statements[person]
    return (
        f"{NAMES[person]} {ROLE[assignment[person]]} says {restate(stmt, assignment)} "
        f"{TRUTH[holds(stmt, assignment)]} {verdict}"
    )


def trace(statements: tuple, q: float = 0.0, rng: np.random.Generator | None = None) -> str:
    """The teacher's completion: assignments tried in order, each person checked in order, until every
    check of one says ok; then the answer after "so".

    q: probability of overlooking a contradiction (writing "ok" after a false knight's or a true knave's
    statement, and checking on); needs `rng`. A try is accepted when every contradiction in it was
    overlooked, which makes its (wrong) assignment the answer."""
    parts = []
    for assignment in assignments(len(statements)):
        parts.append(f"try {answer_text(assignment)}")
        for person, stmt in enumerate(statements):
            contradicts = holds(stmt, assignment) != assignment[person]
            caught = contradicts and not (q > 0 and rng.random() < q)
            verdict = VERDICT[assignment[person]] if caught else "ok"
            parts.append(check(person, statements, assignment, verdict))
            if caught:
                break
        else:
            return " ".join(parts + [f"so {answer_text(assignment)}"])
    raise ValueError("the puzzle has no consistent assignment")


def final_answer(completion: str) -> str | None:
    """The words after the last 'so', space-joined; None when there is no 'so'."""
    words = completion.split()
    if "so" not in words:
        return None
    last = len(words) - 1 - words[::-1].index("so")
    return " ".join(words[last + 1 :])


def written_verdicts(completion: str) -> list[tuple[bool, str]]:
    """(contradiction written, verdict) for every complete check in a completion, read from its own
    words: the role before "says" and the truth before the verdict. A knight with "false" or a knave with
    "true" is a written contradiction whatever the puzzle says; the share of those followed by "ok" is
    what the sloppy teacher sets to q and what the reward has to lower."""
    words, out = completion.split(), []
    for i, w in enumerate(words):
        if w != "says" or i == 0 or words[i - 1] not in ROLE.values():
            continue
        end = next((j for j in range(i + 1, len(words)) if words[j] in ("ok", *VERDICT.values())), None)
        if end is None or words[end - 1] not in TRUTH.values():
            continue  # cut off, or no truth before the verdict: not a check that can be read
        knight, true = words[i - 1] == ROLE[True], words[end - 1] == TRUTH[True]
        out.append((knight != true, words[end]))
    return out


def overlook_share(completions) -> tuple[float, int]:
    """(share of written contradictions followed by "ok", number of written contradictions) over the
    completions (NaN when there is none)."""
    verdicts = [v for c in completions for contradiction, v in written_verdicts(c) if contradiction]
    share = sum(v == "ok" for v in verdicts) / len(verdicts) if verdicts else float("nan")
    return share, len(verdicts)


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
