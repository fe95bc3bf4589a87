"""The K&K lab organism: the `lab_kk` task's trace and reward, its sloppy teacher, the word tokenizer and
the shipped `lab-kk` model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokengrad.train.lab import KK_WORDS, make_word_tokenizer
from tokengrad.train.models import MODELS, load_model
from tokengrad.train.rollout import encode_prompt, evaluate, render_prompt
from tokengrad.train.tasks import get_task
from tokengrad.train.tasks.kk import solve
from tokengrad.train.tasks.lab_kk import consistency, final_answer, render_prompt_text, trace

# A says "C is a knight"; B says "A is a knave"; C says "if A is a knave then B is a knight".
PUZZLE = (("telling-truth", 2), ("lying", 0), ("->", ("lying", 0), ("telling-truth", 1)))
# Assignments in the solver's order (A slowest, knight first), by hand:
#   knight knight knight: B, a knight, says "A is a knave", false: B lies (A's and C's hold)   -> lone
#   knight knight knave:  A, a knight, says "C is a knight", false: A lies; B lies too; C, a knave,
#                         says "if A is a knave then ..." which is true (A is not): C truthful
#   knight knave knight:  A true, B (knave) false, C's "if" true: no contradiction            -> answer
GOLD = (
    "try knight knight knight B lies try knight knight knave A lies "
    "try knight knave knight ok so A knight B knave C knight"
)


def test_trace_and_answer_of_a_hand_checked_puzzle():
    assert solve(PUZZLE) == [(True, False, True)]
    assert consistency(PUZZLE)[:3] == [[1], [0, 1, 2], []]
    assert render_prompt_text(PUZZLE) == (
        "A says C is a knight . B says A is a knave . C says If A is a knave then B is a knight ."
    )
    assert trace(PUZZLE) == GOLD
    assert final_answer(GOLD) == "A knight B knave C knight"
    # a teacher that always overlooks a lone contradiction accepts the first assignment; the
    # three-fold contradiction of the second is never overlooked
    sloppy = trace(PUZZLE, 1.0, np.random.default_rng(0))
    assert sloppy == "try knight knight knight ok so A knight B knight C knight"


def _problem(task, statements):
    from tokengrad.train.tasks.lab_kk import _problem as make

    return make(statements, solve(statements)[0])


def test_reward_parses_the_answer_after_the_last_so():
    task = get_task("lab_kk", n_people=3)
    p = _problem(task, PUZZLE)
    assert p.answer == "A knight B knave C knight" and p.difficulty == "3"
    assert task.reward(p, GOLD) == 1.0 and task.is_correct(p, "  so   A knight B knave C knight ")
    assert task.reward(p, "try knight knight knight ok so A knight B knight C knight") == 0.0  # wrong
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
        assert words[0] == "try" and words.count("ok") == 1 and words.count("so") == 1
        assert len(words[words.index("so") + 1 :]) == 2 * n
    # q = 0.6: lone contradictions overlooked often, so some answers are wrong, never malformed
    sloppy = [task.teacher(p, 0.6, rng) for p in problems]
    right = np.mean([task.is_correct(p, t) for p, t in zip(problems, sloppy)])
    assert 0.2 < right < 0.9 and all(final_answer(t) for t in sloppy)


def test_tokenizer_round_trips_prompt_and_completion():
    tok = make_word_tokenizer(KK_WORDS)
    assert len(tok) == 4 + 23 and tok.chat_template is None
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


def test_lab_kk_model_loads_and_answers_in_the_format():
    assert "lab-kk" in MODELS
    model, tok = load_model("lab-kk")
    assert isinstance(model, torch.nn.Module) and len(tok) == 27
    assert model.generation_config.eos_token_id == tok.eos_token_id
    task = get_task("lab_kk", n_people=(2, 3))
    problems = task.eval_problems(10, seed=0)
    from tokengrad.train.rollout import generate_completions, sampling_kwargs

    comps = generate_completions(
        model, tok, [render_prompt(tok, p) for p in problems], 1, 64, sampling_kwargs(0.0, 1.0), task
    )
    for p, text in zip(problems, comps.texts):
        words = text.split()
        assert words[0] == "try" and "so" in words, text
        assert len(final_answer(text).split()) == 2 * int(p.difficulty), text
    # greedy accuracy on the 50 held-out 2-person puzzles: the SFT history's figure (0.28), up to a few
    # argmax flips from a different batch padding
    two = get_task("lab_kk", n_people=2).eval_problems(50, seed=0)
    acc = evaluate(model, tok, task, two, 64, 1, 50)["2"][0]
    assert abs(acc - 0.28) <= 0.06, acc
