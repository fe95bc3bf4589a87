"""Countdown and arithmetic: TinyZero-style rewards, solvable generation, held-out splits, parameter
checks."""

from fractions import Fraction

import pytest

from tokengrad.train.tasks import get_task
from tokengrad.train.tasks.arithmetic import score_arithmetic
from tokengrad.train.tasks.base import is_held_out
from tokengrad.train.tasks.countdown import evaluate, score_countdown

# ---------------------------------------------------------------------------------------------------
# Countdown
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, value",
    [
        ("(1 + 2) / 3", Fraction(1)),
        ("2*3-4", Fraction(2)),
        ("7/2", Fraction(7, 2)),
        ("-3+5", Fraction(2)),
        ("((((4))))", Fraction(4)),
        ("(1/3 + 3) * 3", Fraction(10)),  # exact: floats would give 10.000000000000002
        ("1/0", None),
        ("2**3", None),  # only + - * / are allowed
        ("7//2", None),
        ("abs(3)", None),
        ("3.5+1", None),
        ("1 2", None),
        ("", None),
    ],
)
def test_evaluate(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "response, reward",
    [
        ("<answer> 3 * 5 + 7 </answer>", 1.0),  # 15 + 7 = 22
        ("<answer>7 + 5 * 3</answer>", 1.0),  # any order of the numbers
        ("<answer>\n3 * 5 + 7\n</answer>", 1.0),  # spread over lines
        ("<answer>3 * 5 - 7</answer>", 0.1),  # 8, wrong value
        ("<answer>(3 + 5) * 7</answer>", 0.1),  # 56
        ("<answer>3 * 5 + 7 + 1</answer>", 0.1),  # an extra number
        ("<answer>3 * 5 + 5 + 2</answer>", 0.1),  # 7 missing, 5 used twice
        ("<answer>22</answer>", 0.1),  # the target alone uses no given number
        ("<answer>3 ** 5 + 7</answer>", 0.1),  # numbers fine, operator not allowed
        ("<answer>3*5-7</answer> no wait <answer>3*5+7</answer>", 1.0),  # the last answer counts
        ("<answer>3*5+7</answer> no wait <answer>3*5-7</answer>", 0.1),
        ("3 * 5 + 7 = 22", 0.0),  # no answer tags
        ("<answer>3 * 5 + 7", 0.0),
    ],
)
def test_countdown_reward(response, reward):
    assert score_countdown(response, 22, (3, 5, 7)) == reward


def test_countdown_last_line_quirk():
    response = "<think> 15 + 7 </think>\n<answer>3 * 5 + 7</answer>\nDone."
    assert score_countdown(response, 22, (3, 5, 7)) == 1.0
    assert score_countdown(response, 22, (3, 5, 7), last_line_only=True) == 0.0  # TinyZero's reading
    assert score_countdown("x\n<answer>3*5+7</answer>", 22, (3, 5, 7), last_line_only=True) == 1.0


def test_countdown_problems_are_solvable():
    task = get_task("countdown", n_numbers=(2, 5), max_number=30, max_target=200)
    problems = task.train_problems(200, seed=1)
    assert {p.difficulty for p in problems} == {"2", "3", "4", "5"}
    for p in problems:
        numbers, target = p.answer["numbers"], p.answer["target"]
        assert len(numbers) == int(p.difficulty) and all(1 <= x <= 30 for x in numbers)
        assert 1 <= target <= 200
        assert p.prompt.startswith(
            f"Using the numbers {list(numbers)}, create an equation that equals {target}."
        )
        assert evaluate(p.meta["witness"]) == target
        assert task.reward(p, f"{p.meta['witness']} </think>\n<answer> {p.meta['witness']} </answer>") == 1.0
        assert task.is_correct(p, f"</think><answer>{p.meta['witness']}</answer>")


def test_countdown_splits():
    task = get_task("countdown")
    train = task.train_problems(300, seed=0)
    assert train == task.train_problems(300, seed=0)
    assert train != task.train_problems(300, seed=1)
    evals = task.eval_problems(30, seed=0)
    assert [p.difficulty for p in evals] == ["3"] * 30 + ["4"] * 30
    keys = [f"countdown|{sorted(p.answer['numbers'])}|{p.answer['target']}" for p in evals]
    assert len(set(keys)) == 60 and all(is_held_out(k) for k in keys)
    assert not any(
        is_held_out(f"countdown|{sorted(p.answer['numbers'])}|{p.answer['target']}") for p in train
    )
    assert task.eval_problems(10, seed=0) == evals[:10] + evals[30:40]  # a prefix per difficulty


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(n_numbers=1), "n_numbers"),
        (dict(n_numbers=7), "n_numbers"),
        (dict(n_numbers=(4, 3)), "n_numbers"),
        (dict(n_numbers="3"), "n_numbers"),
        (dict(max_number=0), "max_number"),
        (dict(max_target=0), "max_target"),
    ],
)
def test_countdown_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        get_task("countdown", **params)


# ---------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, reward",
    [
        ("<answer>123</answer>", 1.0),
        ("<answer> +123 </answer>", 1.0),
        ("67 + 56 = 123 </think> <answer>\n123\n</answer>", 1.0),
        ("<answer>124</answer>", 0.1),
        ("<answer>-123</answer>", 0.1),
        ("<answer>120</answer> hmm <answer>123</answer>", 1.0),  # the last answer counts
        ("<answer>123</answer> hmm <answer>120</answer>", 0.1),
        ("<answer>1,23</answer>", 0.0),  # not a plain integer
        ("<answer>123.0</answer>", 0.0),
        ("<answer>one hundred twenty-three</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("123", 0.0),  # no tags
    ],
)
def test_arithmetic_reward(response, reward):
    assert score_arithmetic(response, 123) == reward


def test_arithmetic_problems():
    task = get_task("arithmetic", digits=(1, 2), ops="+-")
    problems = task.train_problems(300, seed=2)
    assert {p.difficulty for p in problems} == {"1", "2"}
    for p in problems:
        a, op, b = p.meta["expression"].split()
        digits = int(p.difficulty)
        assert op in "+-"
        assert all(len(x) == digits for x in (a, b))  # d-digit operands (0..9 for d = 1)
        assert p.answer == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        assert f"{a} {op} {b} = ?" in p.prompt
        assert task.reward(p, f" {p.answer} </think> <answer>{p.answer}</answer>") == 1.0
        assert task.reward(p, f"</think> <answer>{p.answer + 1}</answer>") == 0.1


def test_arithmetic_answer_only_prompt_and_reward():
    task = get_task("arithmetic", digits=2, ops="+", think=False)
    p = task.train_problems(1, seed=0)[0]
    assert p.response_prefix == "<answer>" and "<think>" not in p.prompt
    assert "only the final answer" in p.prompt
    assert [p.meta["expression"] for p in task.train_problems(5, seed=0)] == [
        q.meta["expression"] for q in get_task("arithmetic", digits=2, ops="+").train_problems(5, seed=0)
    ]
    assert task.reward(p, f" {p.answer} </answer>") == 1.0  # the prefix opened the tag
    assert task.reward(p, f"{p.answer + 1}</answer>") == 0.1
    assert task.reward(p, f" {p.answer}") == 0.0  # never closed: no answer


def test_arithmetic_small_space_eval_repeats_held_out_problems():
    task = get_task("arithmetic", digits=1, ops="+")
    space = [f"arithmetic|{a} + {b}" for a in range(10) for b in range(10)]  # all 100 one-digit sums
    held_out = {k for k in space if is_held_out(k)}
    evals = task.eval_problems(40, seed=0)
    keys = [f"arithmetic|{p.meta['expression']}" for p in evals]
    assert len(keys) == 40 and set(keys) == held_out  # all held-out sums, then repeats
    assert len(held_out) < 40
    train = task.train_problems(500, seed=0)
    assert not {f"arithmetic|{p.meta['expression']}" for p in train} & held_out


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(digits=0), "digits"),
        (dict(digits=13), "digits"),
        (dict(digits=(2, 1)), "digits"),
        (dict(ops=""), "ops"),
        (dict(ops="/"), "ops"),
        (dict(ops="++"), "ops"),
        (dict(ops=["+"]), "ops"),
        (dict(think="no"), "think"),
    ],
)
def test_arithmetic_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        get_task("arithmetic", **params)


def test_bad_calls():
    task = get_task("arithmetic")
    with pytest.raises(ValueError, match="n_per_difficulty"):
        task.eval_problems(0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        task.train_problems(5, seed=-2)
    with pytest.raises(ValueError, match="n must be"):
        task.train_problems(-1, seed=0)
