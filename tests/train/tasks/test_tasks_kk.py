"""Knights & Knaves: byte-exact regeneration of the published data, uniqueness, the Logic-RL reward."""

import hashlib
import itertools
from collections import Counter

import pytest

from tokengrad.train.tasks import get_task
from tokengrad.train.tasks.kk import published_problems, sample_puzzles, solve
from tokengrad.train.tasks.kk_format import format_puzzle, parse_answer, parse_truth, score_response

# The worked example of the K&K generator (N=3, seed 1234, list index 0).
EXAMPLE_QUIZ = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and "
    'knaves always lie. You meet 3 inhabitants: Penelope, David, and Zoey. Penelope noted, "David is a '
    'knight if and only if David is a knave". David told you that Zoey is a knave if and only if Zoey is a '
    'knight. According to Zoey, "If Penelope is a knave then David is a knave". So who is a knight and who '
    "is a knave?"
)
EXAMPLE_SOLUTION = "Penelope is a knave, David is a knave, and Zoey is a knight."

# Logic-RL data/kk/instruct/3ppl/train.parquet, row 0 (list index 100): the full chat-formatted prompt.
LOGIC_RL_3PPL_TRAIN_0 = (
    "<|im_start|>system\nYou are a helpful assistant. The assistant first thinks about the reasoning process "
    "in the mind and then provides the user with the answer. The reasoning process and answer are enclosed "
    "within <think> </think> and<answer> </answer> tags, respectively, i.e., <think> reasoning process here "
    "</think><answer> answer here </answer>.  Now the user asks you to solve a logical reasoning problem. "
    "After thinking, when you finally reach a conclusion, clearly state the identity of each character "
    "within <answer> </answer> tags. i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>.\n<|im_end|>\n"
    "<|im_start|>user\nA very special island is inhabited only by knights and knaves. Knights always tell "
    "the truth, and knaves always lie. You meet 3 inhabitants: Michael, Zoey, and Ethan. Michael was heard "
    'saying, "Ethan is a knight if and only if Michael is a knight". "Zoey is a knight or Ethan is a '
    'knight," Zoey mentioned. Ethan asserted: "Michael is a knave if and only if Zoey is a knave". So who is '
    "a knight and who is a knave?\n<|im_end|>\n<|im_start|>assistant\n<think>"
)

# Logic-RL data/kk/instruct/7ppl/test.parquet, last row (list index 1099).
LOGIC_RL_7PPL_TEST_LAST = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and "
    "knaves always lie. You meet 7 inhabitants: Joseph, Evelyn, Liam, Harper, Lily, Elizabeth, and Luke. "
    'Joseph was heard saying, "Lily is a knave if and only if Joseph is a knight". "Luke is not a knight," '
    'Evelyn claimed. Liam said, "Luke is a knave." Harper asserted: "Lily is a knight if and only if Joseph '
    'is a knight". Lily said, "Harper is a knave and Lily is a knight." Elizabeth noted, "Luke is a knight". '
    '"If Joseph is a knight then Elizabeth is a knave," Luke declared. So who is a knight and who is a knave?'
)
LOGIC_RL_7PPL_TEST_LAST_ANSWER = (
    "(1) Joseph is a knave\n(2) Evelyn is a knave\n(3) Liam is a knave\n"
    "(4) Harper is a knight\n(5) Lily is a knave\n(6) Elizabeth is a knight\n"
    "(7) Luke is a knight"
)

# sha256 of "\n\n".join(quiz + "\n" + solution_text_format) over Logic-RL's train then test parquet rows
# (list indices 100..1099), computed from the published files.
LOGIC_RL_SHA256 = {
    3: "9a6cb98aba469a9d5ba2df0cf1a0052585f8814918d5f6bf1556da95ba10f2ca",
    4: "61e1ad52d432bfa335c4a0c6de4d035d4ae9a20809fc7f5d67cd485eada28b6c",
    5: "b3a5a4aa320850aee446ce35e9cd2174cfff3895d37d05697fbcb581933b28f1",
    6: "332bbb158f449e78d34559118e0677ad75951b1471df9223cd180267750d98e9",
    7: "e6651dc4d13cb5d666d562703079b8a68f8e717eb02bd26049383d5b8af88bf9",
}


def chatml(problem):
    return (
        f"<|im_start|>system\n{problem.system}<|im_end|>\n<|im_start|>user\n{problem.prompt}<|im_end|>\n"
        f"<|im_start|>assistant\n{problem.response_prefix}"
    )


# ---------------------------------------------------------------------------------------------------
# Regenerating the published data
# ---------------------------------------------------------------------------------------------------


def test_worked_example_is_reproduced():
    puzzle = sample_puzzles(3, 1)[0]
    assert puzzle.statements == (
        ("<=>", ("telling-truth", 1), ("lying", 1)),
        ("<=>", ("lying", 2), ("telling-truth", 2)),
        ("->", ("lying", 0), ("lying", 1)),
    )
    # Penelope's "David is a knight iff David is a knave" is false, so she is a knave; David's statement is
    # false too (knave); then Zoey's "if Penelope is a knave then David is a knave" is true: knight.
    assert puzzle.solution == (False, False, True)
    text = format_puzzle(puzzle.statements, puzzle.solution, index=0)
    assert text.quiz == EXAMPLE_QUIZ
    assert text.solution_text == EXAMPLE_SOLUTION
    assert text.solution_text_format == "(1) Penelope is a knave\n(2) David is a knave\n(3) Zoey is a knight"


def test_logic_rl_prompt_is_byte_exact_under_chatml():
    problem = published_problems(3, 100, 101)[0]
    assert chatml(problem) == LOGIC_RL_3PPL_TRAIN_0
    assert problem.answer == "(1) Michael is a knight\n(2) Zoey is a knight\n(3) Ethan is a knight"
    assert problem.meta["statements"] == (
        "(('<=>', ('telling-truth', 2), ('telling-truth', 0)), "
        "('or', ('telling-truth', 1), ('telling-truth', 2)), "
        "('<=>', ('lying', 0), ('lying', 1)))"
    )


def test_last_logic_rl_7_person_test_puzzle():
    problem = published_problems(7, 1099, 1100)[0]
    assert problem.prompt == LOGIC_RL_7PPL_TEST_LAST + "\n"
    assert problem.answer == LOGIC_RL_7PPL_TEST_LAST_ANSWER
    assert problem.difficulty == "7" and problem.meta["index"] == 1099


@pytest.mark.parametrize("n_people", sorted(LOGIC_RL_SHA256))
def test_all_logic_rl_puzzles_are_byte_exact(n_people):
    rows = [p.prompt[:-1] + "\n" + p.answer for p in published_problems(n_people, 100, 1100)]
    assert len(rows) == 1000
    assert hashlib.sha256("\n\n".join(rows).encode()).hexdigest() == LOGIC_RL_SHA256[n_people]


def test_logic_rl_3_person_knight_balance():
    # Published balance of the 3ppl train split: 0..3 knights = 92 / 312 / 354 / 142.
    counts = Counter(p.meta["n_knights"] for p in published_problems(3, 100, 1000))
    assert [counts[k] for k in range(4)] == [92, 312, 354, 142]


def test_longer_list_starts_with_shorter_one():
    assert sample_puzzles(4, 60)[:25] == sample_puzzles(4, 25)
    assert sample_puzzles(4, 25, seed=7) != sample_puzzles(4, 25)


# ---------------------------------------------------------------------------------------------------
# Uniqueness, checked by an independent brute force
# ---------------------------------------------------------------------------------------------------


def truth(stmt, assign):
    op = stmt[0]
    if op == "telling-truth":
        return assign[stmt[1]]
    if op == "lying":
        return not assign[stmt[1]]
    vals = [truth(s, assign) for s in stmt[1:]]
    return {
        "not": lambda: not vals[0],
        "and": lambda: all(vals),
        "or": lambda: any(vals),
        "->": lambda: (not vals[0]) or vals[1],
        "<=>": lambda: vals[0] == vals[1],
    }[op]()


def consistent(statements):
    n = len(statements)
    return [
        a
        for a in itertools.product([True, False], repeat=n)
        if all(a[i] == truth(s, a) for i, s in enumerate(statements))
    ]


def leaves(stmt):
    return [stmt] if stmt[0] in ("telling-truth", "lying") else [x for s in stmt[1:] for x in leaves(s)]


@pytest.mark.parametrize("n_people", range(2, 9))
def test_every_puzzle_has_exactly_its_solution(n_people):
    puzzles = sample_puzzles(n_people, 40, seed=11)
    assert len(puzzles) == 40
    assert len({p.statements for p in puzzles}) == 40
    for p in puzzles:
        assert consistent(p.statements) == [p.solution]
        for person, stmt in enumerate(p.statements):
            assert ("lying", person) not in leaves(stmt)  # nobody says "I am a knave"
            if stmt[0] not in ("telling-truth", "lying", "not"):
                assert len(stmt) == 3 and stmt[1] != stmt[2]  # two distinct operands


def test_solver_lists_all_solutions():
    # Person 0: "person 1 is a knight"; person 1: "person 0 is a knight" -> both knights or both knaves.
    assert solve((("telling-truth", 1), ("telling-truth", 0))) == [(True, True), (False, False)]
    # Person 0: "person 0 is a knave" has no consistent assignment.
    assert solve((("lying", 0), ("telling-truth", 0))) == []


def test_two_person_puzzle_space():
    # Each speaker has 3 admissible leaves -> 3 + 3 (not) + 4 * 3 * 2 (ordered distinct pairs)
    # = 30 statements.
    def statements(p):
        base = [(k, j) for k in ("telling-truth", "lying") for j in range(2) if (k, j) != ("lying", p)]
        return (
            base
            + [("not", b) for b in base]
            + [(op, a, b) for op in ("and", "or", "->", "<=>") for a in base for b in base if a != b]
        )

    space = [(a, b) for a in statements(0) for b in statements(1)]
    assert len(space) == 900
    assert sum(len(solve(s)) == 1 for s in space) == 399
    assert all(solve(s) == consistent(s) for s in space[::7])  # the fast solver against brute force
    assert len(published_problems(2, 0, 10_000)) == 398  # the list stops after 400 slots


# ---------------------------------------------------------------------------------------------------
# Logic-RL reward
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example():
    task = get_task("kk", n_people=3)
    problem = task.eval_problems(1, seed=0)[0]
    assert problem.prompt == EXAMPLE_QUIZ + "\n" and problem.response_prefix == "<think>"
    return task, problem


RIGHT = "(1) Penelope is a knave\n(2) David is a knave\n(3) Zoey is a knight"
WRONG = "(1) Penelope is a knave\n(2) David is a knave\n(3) Zoey is a knave"


@pytest.mark.parametrize(
    "completion, reward, correct",
    [
        # well formed and right: +1 format, +2 answer
        (f" Penelope contradicts herself. </think>\n<answer> {RIGHT} </answer>", 3.0, True),
        # case-insensitive names and roles
        (f"</think><answer>{RIGHT.upper()}</answer>", 3.0, True),
        # well formed, wrong: +1 - 1.5
        (f" ... </think>\n<answer> {WRONG} </answer>", -0.5, False),
        # well formed, Zoey missing: +1 - 2
        (
            " ... </think><answer> (1) Penelope is a knave (2) David is a knave (3) a knight </answer>",
            -1.0,
            False,
        ),
        # well formed, four roles named for three people ("knights" counts as a role word): +1 - 2
        (f" ... </think><answer> {RIGHT}; the others are knights </answer>", -1.0, False),
        # well formed, empty answer: +1 - 2
        (" ... </think><answer>  </answer>", -1.0, False),
        # the model opens <think> again although the prompt already did: two <think> -> -1 - 2
        (f"<think> ... </think><answer> {RIGHT} </answer>", -3.0, False),
        # no </think>: -1 - 2
        (f" ... <answer> {RIGHT} </answer>", -3.0, False),
        # tags out of order: -1 - 2
        (f" ... <answer> {RIGHT} </answer></think>", -3.0, False),
        # two answers: -1 - 2
        (f" ... </think><answer> {WRONG} </answer><answer> {RIGHT} </answer>", -3.0, False),
        # nothing at all
        ("", -3.0, False),
    ],
)
def test_logic_rl_reward(example, completion, reward, correct):
    task, problem = example
    assert task.reward(problem, completion) == reward
    assert task.is_correct(problem, completion) is correct


def test_answer_parsing():
    assert parse_truth("(1) Zoey is a knight\n(2) Liam is a knave") == {"Zoey": "knight", "Liam": "knave"}
    assert parse_answer("Zoey is a knight, Liam is a knave", ["Zoey", "Liam"]) == {
        "Zoey": "knight",
        "Liam": "knave",
    }
    assert parse_answer("Zoey is a knight", ["Zoey", "Liam"]) is None  # one role for two
    assert parse_answer("Zoey is a knight and a knave", ["Zoey", "Liam"]) is None  # Liam not named
    score = score_response(
        "<think>x</think><answer>Zoey is a knave, Liam is a knave</answer>",
        "(1) Zoey is a knight\n(2) Liam is a knave",
    )
    assert (score.format_score, score.answer_score, score.total) == (1.0, -1.5, -0.5)


# ---------------------------------------------------------------------------------------------------
# Task API
# ---------------------------------------------------------------------------------------------------


def test_train_and_eval_sets():
    task = get_task("kk", n_people=(2, 3), train_size=150)
    evals = task.eval_problems(20, seed=0)
    assert [p.difficulty for p in evals] == ["2"] * 20 + ["3"] * 20
    assert [p.meta["index"] for p in evals] == list(range(20)) * 2
    assert task.eval_problems(20, seed=5) == evals  # the held-out set is fixed
    train = task.train_problems(700, seed=3)  # > 300 puzzles: a second epoch
    assert train == task.train_problems(700, seed=3)
    assert train[:50] != task.train_problems(50, seed=4)
    assert len({p.prompt for p in train[:300]}) == 300  # one epoch has no repeats
    assert {p.difficulty for p in train} == {"2", "3"}
    assert all(100 <= p.meta["index"] < 250 for p in train)
    assert not {p.meta["statements"] for p in train} & {p.meta["statements"] for p in evals}


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(n_people=1), "n_people"),
        (dict(n_people=9), "n_people"),
        (dict(n_people=(4, 3)), "n_people"),
        (dict(n_people="3"), "n_people"),
        (dict(eval_size=0), "eval_size"),
        (dict(train_size=-1), "train_size"),
        (dict(data_seed=-1), "data_seed"),
    ],
)
def test_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        get_task("kk", **params)


def test_bad_calls():
    task = get_task("kk", n_people=3)
    with pytest.raises(ValueError, match="n_per_difficulty"):
        task.eval_problems(101, seed=0)
    with pytest.raises(ValueError, match="seed"):
        task.train_problems(3, seed=-1)
    with pytest.raises(ValueError, match="unknown task 'sudoku'; known tasks:") as err:
        get_task("sudoku")
    for name in ("arithmetic", "countdown", "kk", "toolqa"):  # other tests may register more tasks
        assert f"'{name}'" in str(err.value)
