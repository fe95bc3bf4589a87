"""The K&K lab organism: the `lab_kk` task's trace and reward, its sloppy teacher, the word tokenizer and
the shipped `lab-kk` model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokengrad.train.generation import encode_prompt, evaluate, render_prompt
from tokengrad.train.lab import KK_WORDS, make_word_tokenizer
from tokengrad.train.models import MODELS, load_model
from tokengrad.train.tasks import get_task
from tokengrad.train.tasks.kk import solve
from tokengrad.train.tasks.lab_kk import (
    check,
    final_answer,
    holds,
    overlook_share,
    render_prompt_text,
    restate,
    trace,
    written_verdicts,
)

# A says "C is a knight"; B says "A is a knave"; C says "if A is a knave then B is a knight".
PUZZLE = (("telling-truth", 2), ("lying", 0), ("->", ("lying", 0), ("telling-truth", 1)))
# By hand: every name in the trace is followed by the role the current try gives that person; a claim reads
# (role claimed, person, role tried, yes/no), a statement its truth, a check its verdict.
#   knight knight knight: A's "C knight" holds (ok); B's "A knave" is false and B is a knight: B lies
#   knight knight knave:  A's "C knight" is false and A is a knight: A lies
#   knight knave knight:  A ok; B (a knave) says "A knave", false: ok; C's "if A knave ..." holds: ok
GOLD = (
    "try A knight B knight C knight A knight says knight C knight yes true ok "
    "B knight says knave A knight no false lies "
    "try A knight B knight C knave A knight says knight C knave no false lies "
    "try A knight B knave C knight A knight says knight C knight yes true ok "
    "B knave says knave A knight no false ok "
    "C knight says if knave A knight no then knight B knave no true ok so A knight B knave C knight"
)
# a teacher that overlooks every contradiction accepts the first assignment, checking every person
ALWAYS_SLOPPY = (
    "try A knight B knight C knight A knight says knight C knight yes true ok "
    "B knight says knave A knight no false ok "
    "C knight says if knave A knight no then knight B knight yes true ok so A knight B knight C knight"
)


def test_trace_and_answer_of_a_hand_checked_puzzle():
    assert solve(PUZZLE) == [(True, False, True)]
    tries = [(True, True, True), (True, True, False), (True, False, True)]  # the solver's first three
    contradicting = [[i for i, s in enumerate(PUZZLE) if holds(s, a) != a[i]] for a in tries]
    assert contradicting == [[1], [0, 1, 2], []]
    assert render_prompt_text(PUZZLE) == (
        "A says C is a knight . B says A is a knave . C says If A is a knave then B is a knight ."
    )
    assert trace(PUZZLE) == GOLD
    assert final_answer(GOLD) == "A knight B knave C knight"
    assert trace(PUZZLE, 1.0, np.random.default_rng(0)) == ALWAYS_SLOPPY


def test_restated_operators_and_truths():
    knights = (True, False)  # A knight, B knave
    assert restate(("not", ("lying", 1)), knights) == "not knave B knave yes"
    assert restate(("and", ("telling-truth", 0), ("lying", 1)), knights) == (
        "knight A knight yes and knave B knave yes"
    )
    assert restate(("<=>", ("lying", 0), ("telling-truth", 1)), knights) == (
        "knave A knight no iff knight B knave no"
    )
    # truths by hand: not(B knave) is false, (A knight and B knave) true, (A knave <=> B knight) true,
    # (A knave or B knight) false, (A knight -> B knight) false
    cases = [
        (("not", ("lying", 1)), False),
        (("and", ("telling-truth", 0), ("lying", 1)), True),
        (("<=>", ("lying", 0), ("telling-truth", 1)), True),
        (("or", ("lying", 0), ("telling-truth", 1)), False),
        (("->", ("telling-truth", 0), ("telling-truth", 1)), False),
    ]
    for stmt, truth in cases:
        assert holds(stmt, knights) is truth, stmt
    # a knave whose statement holds is truthful; verdicts name the speaker and the speaker's role
    assert check(1, ((("telling-truth", 0)), ("telling-truth", 0)), knights, "truthful") == (
        "B knave says knight A knight yes true truthful"
    )


def test_sloppy_teacher_overlooks_each_contradiction_with_probability_q():
    # on try 1 only B contradicts: overlooked with probability q, so the first answer is wrong that often
    rng = np.random.default_rng(0)
    wrong = np.mean(
        [final_answer(trace(PUZZLE, 0.3, rng)) != "A knight B knave C knight" for _ in range(4000)]
    )
    assert abs(wrong - 0.3) < 0.025, wrong


def test_written_verdicts_and_the_overlook_share():
    # GOLD by hand: 7 checks; written contradictions: B knight false (lies), A knight false (lies); the
    # B knave false check is consistent (ok). ALWAYS_SLOPPY: B knight false ok is the one contradiction.
    assert written_verdicts(GOLD) == [
        (False, "ok"),
        (True, "lies"),
        (True, "lies"),
        (False, "ok"),
        (False, "ok"),
        (False, "ok"),
    ]
    assert written_verdicts(ALWAYS_SLOPPY) == [(False, "ok"), (True, "ok"), (False, "ok")]
    assert overlook_share([GOLD, ALWAYS_SLOPPY]) == (pytest.approx(1 / 3), 3)
    # read from the words written, not the puzzle: a knave writing "true" is a contradiction; a check cut
    # off before its verdict, or without a truth before it, is skipped
    assert written_verdicts("try A knave A knave says knight A knave no true ok B knight says") == [
        (True, "ok")
    ]
    assert written_verdicts("A knight says knave B knight no lies") == []
    share, n = overlook_share(["so A knight"])
    assert n == 0 and np.isnan(share)
    # the teacher's rate: q = 0.6 per contradiction, over many sloppy traces
    rng = np.random.default_rng(1)
    share, n = overlook_share([trace(PUZZLE, 0.6, rng) for _ in range(2000)])
    assert n > 2000 and abs(share - 0.6) < 0.03, (share, n)


def _problem(task, statements):
    from tokengrad.train.tasks.lab_kk import _problem as make

    return make(statements, solve(statements)[0])


def test_reward_parses_the_answer_after_the_last_so():
    task = get_task("lab_kk", n_people=3)
    p = _problem(task, PUZZLE)
    assert p.answer == "A knight B knave C knight" and p.difficulty == "3"
    assert task.reward(p, GOLD) == 1.0 and task.is_correct(p, "  so   A knight B knave C knight ")
    assert task.reward(p, ALWAYS_SLOPPY) == 0.0  # wrong
    assert task.reward(p, GOLD + " C") == 0.0  # trailing word
    assert task.reward(p, "A knight B knave C knight") == 0.0  # no "so": malformed
    assert task.reward(p, "so A knight so B knave") == 0.0 and final_answer("try so") == ""
    assert final_answer("no answer here") is None


def test_teacher_with_q0_is_always_right_and_the_trace_parses():
    task = get_task("lab_kk", n_people=(2, 4), train_pool=300)
    rng = np.random.default_rng(0)
    problems = task.train_problems(60, seed=1)
    for p in problems:
        text = task.teacher(p, 0.0, rng)
        assert task.is_correct(p, text), (p.prompt, text)
        words = text.split()
        n = int(p.difficulty)
        assert words[0] == "try" and words.count("so") == 1
        assert len(words[words.index("so") + 1 :]) == 2 * n
        # the accepted try checks all n people, each with an ok
        last_try = words[len(words) - 1 - words[::-1].index("try") :]
        assert last_try.count("says") == n and last_try.count("ok") == n
    # q = 0.6: contradictions overlooked often, so some answers are wrong, never malformed
    sloppy = [task.teacher(p, 0.6, rng) for p in problems]
    right = np.mean([task.is_correct(p, t) for p, t in zip(problems, sloppy)])
    assert 0.2 < right < 0.9 and all(final_answer(t) for t in sloppy)


def test_tokenizer_round_trips_prompt_and_completion():
    tok = make_word_tokenizer(KK_WORDS)
    assert len(tok) == 4 + 28 and tok.chat_template is None
    task = get_task("lab_kk", n_people=4, train_pool=50)
    p = task.train_problems(1, seed=0)[0]
    text = render_prompt(tok, p)
    ids = encode_prompt(tok, text)
    assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == p.prompt
    completion = task.teacher(p, 0.0, np.random.default_rng(0))
    target = tok(completion, add_special_tokens=False).input_ids
    assert len(target) == len(completion.split()) and tok.unk_token_id not in target
    assert tok.decode(target, skip_special_tokens=True) == completion


def test_eval_is_balanced_by_people_and_apart_from_training():
    task = get_task("lab_kk", n_people=(3, 4), eval_people=(2, 4), train_pool=500)
    held = task.eval_problems(30, seed=0)
    assert [p.difficulty for p in held] == ["2"] * 30 + ["3"] * 30 + ["4"] * 30
    assert held == task.eval_problems(30, seed=5)  # fixed: the seed does not change it
    assert len({p.prompt for p in held if p.difficulty == "3"}) == 30
    train = task.train_problems(400, seed=0)
    assert {p.difficulty for p in train} == {"3", "4"}
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    with pytest.raises(ValueError, match="n_people"):
        get_task("lab_kk", n_people=6)


def test_lab_kk_model_loads_and_sits_on_the_sloppy_plateau():
    assert "lab-kk" in MODELS
    model, tok = load_model("lab-kk")
    assert isinstance(model, torch.nn.Module) and len(tok) == 4 + 28
    assert model.generation_config.eos_token_id == tok.eos_token_id
    from tokengrad.train.generation import generate_completions, sampling_kwargs

    # The teacher overlooks a contradiction with q = 0.6 > 0.5, so a model that fits it decodes greedily
    # to "ok" after every check and accepts the first try, all knights: its greedy accuracy is the share
    # of puzzles whose solution that is (13 of the 50 held-out 2-person puzzles, 4 of the 3-person ones).
    for n, first_right in ((2, 13), (3, 4)):
        task = get_task("lab_kk", n_people=n)
        problems = task.eval_problems(50, seed=0)
        comps = generate_completions(
            model,
            tok,
            [render_prompt(tok, p) for p in problems],
            n_samples=1,
            max_new_tokens=200,
            sampling=sampling_kwargs(0.0, 1.0),
            task=task,
        )
        first = " ".join(f"{name} knight" for name in "ABCDE"[:n])
        assert sum(p.answer == first for p in problems) == first_right
        for text in comps.texts:
            words = text.split()
            assert words[0] == "try" and words.count("says") == n, text
            assert final_answer(text) == first, text
        assert (
            evaluate(model, tok, task, problems=problems, max_new_tokens=200, max_turns=1, batch_size=50)[
                str(n)
            ][0]
            == first_right / 50
        )
