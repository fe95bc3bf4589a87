"""The CPU lab: compact addition task, sloppy-carry teacher, word-level tokenizer, SFT, the shipped
`lab-add` model and a few trainer steps on it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tokengrad
from tokengrad import load_run
from tokengrad.train.generation import encode_prompt, render_prompt
from tokengrad.train.lab import ADD_CONFIG, ADD_WORDS, make_lab_model, make_word_tokenizer
from tokengrad.train.models import MODELS, load_model
from tokengrad.train.sft import SFTConfig, encode_examples, lr_at, sft_loss, supervised_train
from tokengrad.train.tasks import get_task
from tokengrad.train.tasks.base import is_held_out
from tokengrad.train.tasks.lab_add import column_carries, sloppy_sum, spaced


def test_carries_and_sloppy_teacher_by_hand():
    assert column_carries(1234, 5678) == [True, True, False, False]  # 4+8=12, 3+7+1=11, 2+6+1=9, 1+5=6
    rng = np.random.default_rng(0)
    assert sloppy_sum(1234, 5678, 0.0, rng) == 6912
    assert sloppy_sum(1234, 5678, 1.0, rng) == 6802  # 12 -> 2, 10 -> 0, 8, 6
    assert sloppy_sum(9999, 9999, 1.0, rng) == 8888  # no carry ever reaches a column
    assert sloppy_sum(9999, 9999, 0.0, rng) == 19998
    # drop 0.5 on 4 carries: every carry is kept with probability 1/2, so the right sum is ~1/16 of draws
    hits = np.mean([sloppy_sum(9999, 9999, 0.5, rng) == 19998 for _ in range(4000)])
    assert abs(hits - 1 / 16) < 0.015


def test_lab_add_format_difficulty_and_split():
    task = get_task("lab_add", digits=4)
    train, held = task.train_problems(200, seed=3), task.eval_problems(20, seed=3)
    p = train[0]
    a, b = p.meta["a"], p.meta["b"]
    assert p.prompt == f"{spaced(a)} + {spaced(b)} =" and p.prompt.count(" ") == 9
    assert p.answer == " ".join(str(a + b)) and p.system is None and p.response_prefix == ""
    for q in train + held:
        assert 1000 <= q.meta["a"] <= 9999 and 1000 <= q.meta["b"] <= 9999
        assert q.difficulty == str(sum(column_carries(q.meta["a"], q.meta["b"])))
    assert sorted({q.difficulty for q in held}) == ["0", "1", "2", "3", "4"]
    assert [q.difficulty for q in held].count("4") == 20
    keys = lambda ps: {f"lab_add|{q.meta['a']}+{q.meta['b']}" for q in ps}  # noqa: E731
    assert not keys(train) & keys(held)
    assert all(is_held_out(k) for k in keys(held)) and not any(is_held_out(k) for k in keys(train))
    with pytest.raises(ValueError, match="digits"):
        get_task("lab_add", digits=1)


def test_lab_add_exact_match_reward():
    task = get_task("lab_add", digits=4)
    p = next(q for q in task.eval_problems(5, seed=0) if q.meta["a"] + q.meta["b"] >= 10000)
    right = " ".join(str(p.meta["a"] + p.meta["b"]))
    assert task.reward(p, right) == 1.0 and task.is_correct(p, f"  {right} ")
    assert task.reward(p, right.replace(" ", "")) == 0.0  # digits must be separate words
    assert task.reward(p, right[2:]) == 0.0 and task.reward(p, "") == 0.0
    rng = np.random.default_rng(1)
    assert task.teacher(p, 0.0, rng) == right


def test_word_tokenizer_round_trip():
    tok = make_word_tokenizer(ADD_WORDS)
    assert len(tok) == 16 and tok.eos_token == "</s>" and tok.chat_template is None
    task = get_task("lab_add", digits=4)
    p = task.train_problems(1, seed=0)[0]
    text = render_prompt(tok, p)
    assert text == p.prompt + "\n"
    ids = encode_prompt(tok, text)
    assert ids[0] == tok.bos_token_id and len(ids) == 11 and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == p.prompt
    target = tok(p.answer, add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert tok.decode(target, skip_special_tokens=True) == p.answer


def test_sft_schedule_and_loss_decreases():
    cfg = SFTConfig(steps=110, lr=1e-3, min_lr=1e-4, warmup_steps=10)
    assert lr_at(cfg, 0) == pytest.approx(1e-4) and lr_at(cfg, 9) == pytest.approx(1e-3)
    assert lr_at(cfg, 60) == pytest.approx(1e-4 + 0.45e-3 * (1 + math.cos(math.pi / 2)))
    assert lr_at(cfg, 110) == pytest.approx(1e-4)
    tok = make_word_tokenizer(ADD_WORDS)
    model = make_lab_model(
        tok,
        seed=0,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    task = get_task("lab_add", digits=2)
    batch = [(render_prompt(tok, p), p.answer) for p in task.train_problems(16, seed=0)]
    ids, attn, P, comp, mask = encode_examples(tok, batch)
    assert P == 7 and mask.sum(1).tolist() == [len(t.split()) + 1 for _, t in batch]  # digits + EOS
    before = sft_loss(model, (ids, attn, P, comp, mask)).item()
    assert before == pytest.approx(math.log(16), rel=0.1)  # near-uniform over 16 tokens
    history = supervised_train(
        model,
        tok,
        lambda step: batch,
        SFTConfig(steps=40, lr=3e-3, warmup_steps=0, progress=False),
        evaluate=lambda step: {"n": step},
    )
    assert [h["step"] for h in history] == [39] and history[0]["n"] == 39
    assert sft_loss(model, (ids, attn, P, comp, mask)).item() < 0.5 * before


def test_lab_add_model_resolves_offline():
    assert "lab-add" in MODELS
    model, tok = load_model("lab-add")
    assert isinstance(model, torch.nn.Module) and len(tok) == 16
    assert 0.8e6 < sum(p.numel() for p in model.parameters()) < 0.9e6
    assert model.config.hidden_size == ADD_CONFIG["hidden_size"]
    assert model.generation_config.eos_token_id == tok.eos_token_id
    # the warm start gets some problems right and stops with end-of-sequence
    task = get_task("lab_add", digits=4)
    from tokengrad.train.generation import evaluate

    acc = evaluate(
        model,
        tok,
        task,
        problems=task.eval_problems(20, seed=0),
        max_new_tokens=6,
        max_turns=1,
        batch_size=100,
    )
    assert acc["0"][0] > 0.5 and 0 < sum(a for a, _ in acc.values()) / 5 < 0.9


def test_lab_add_sits_on_the_sloppy_teachers_plateau():
    # The organism's design (scripts/make_lab_model.py): fitted to a teacher that keeps each carry with
    # probability 1 - 0.6, the model writes a carry with probability ~0.4, so greedy decoding drops carries
    # while sampling gets one-carry problems right ~40 % of the time: RL has signal and room.
    from tokengrad.train.generation import evaluate, generate_completions, sampling_kwargs

    model, tok = load_model("lab-add")
    task = get_task("lab_add", digits=4)
    one_carry = [p for p in task.eval_problems(40, seed=3) if p.difficulty == "1"]
    greedy = evaluate(model, tok, task, problems=one_carry, max_new_tokens=6, max_turns=1, batch_size=100)[
        "1"
    ][0]
    torch.manual_seed(0)
    comps = generate_completions(
        model,
        tok,
        [render_prompt(tok, p) for p in one_carry],
        n_samples=10,
        max_new_tokens=6,
        sampling=sampling_kwargs(1.0, 1.0),
        task=task,
    )
    sampled = np.mean([task.is_correct(p, t) for p, t in zip(np.repeat(one_carry, 10), comps.texts)])
    assert greedy < 0.25 and 0.25 < sampled < 0.55, (greedy, sampled)


def test_few_trainer_steps_on_lab_add(tmp_path):
    run_dir = tokengrad.train.run(
        "configs/lab_add_grpo.toml",
        steps=2,
        eval_every=2,
        eval_per_difficulty=2,
        bucket_every=1,
        run_dir=str(tmp_path / "run"),
        progress=False,
    )
    run = load_run(run_dir)
    assert sorted(run.evals["step"].unique().tolist()) == [-1, 1]  # the step -1 baseline
    assert sorted(run.evals["difficulty"].unique().tolist()) == ["0", "1", "2", "3", "4"]
    assert run.evals["n"].eq(2).all()
    assert len(run.steps) == 2 and set(run.samples["completion"].str.split().str.len()) <= {3, 4, 5, 6}
    assert len(run.samples) == 2 * 64 and run.samples["reward"].isin([0.0, 1.0]).all()


def test_sft_phases_name_their_teacher():
    from test_multiprocess import load_script

    script = load_script("make_lab_model.py")
    # a phase without a drop takes --drop; one with a drop keeps its own
    assert script.parse_phases("600:2e-3:0,300:1e-3", 0.6) == [(600, 2e-3, 0.0), (300, 1e-3, 0.6)]
    assert script.parse_phases("1000:2e-3", 0.6) == [(1000, 2e-3, 0.6)]
    for bad in ("600", "600:2e-3:0:1", "600:0", "600:1e-3:1.5", "x:1e-3"):
        with pytest.raises(SystemExit, match="--phases"):
            script.parse_phases(bad, 0.6)
