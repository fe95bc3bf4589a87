"""The built-in GRPO trainer: short CPU runs on the tiny model, checked through the run it records."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from letters_task import LettersTask

from tokengrad import load_run, schema
from tokengrad.cli.train import cli_train
from tokengrad.objective.loss import micro_batch_share
from tokengrad.objective.weighting import WEIGHTINGS
from tokengrad.train.generation import (
    gather_logprobs,
    generate_completions,
    make_generation_batch,
    policy_forward,
    render_prompt,
    sampling_kwargs,
)
from tokengrad.train.models import load_model
from tokengrad.train.tasks import Problem
from tokengrad.train.trainer import train

TIMING = ["time_step", "time_record", "time_generate", "time_score", "time_update"]


def tiny(tmp_path, name="run", **overrides) -> dict:
    """A two-step run: 2 prompts x G=2, 8 new tokens, on the tiny model, in fp32 (the real-task tests below
    run with bf16 autocast)."""
    cfg = dict(
        model="tiny",
        task="letters",
        steps=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=8,
        lr=1e-2,
        bf16=False,
        progress=False,
        run_dir=str(tmp_path / name),
    )
    return {**cfg, **overrides}


def check_run(run_dir, steps: int) -> None:
    """The run directory follows tokengrad.schema: meta, every fixed column with its arrow type, rows."""
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    assert meta["schema_version"] == schema.SCHEMA_VERSION and meta["finished"] is True
    for table in ("tokens", "steps", "layers", "samples"):
        files = sorted((run_dir / table).rglob("*.parquet"))
        assert files, f"no {table} files"
        fixed = schema.arrow_schema(table)
        for f in files:
            got = pq.read_schema(f)
            for field in fixed:
                assert got.field(field.name).type == field.type, (table, field.name)
    run = load_run(run_dir)
    assert len(run.tokens()) > 0 and len(run.samples) > 0 and len(run.layers) > 0
    assert run.steps["step"].tolist() == list(range(steps))


@pytest.mark.parametrize("rule", sorted(WEIGHTINGS))
def test_two_step_smoke_run_for_every_weighting_rule(tmp_path, rule):
    run_dir = train(tiny(tmp_path, weighting=rule))
    check_run(run_dir, steps=2)
    run = load_run(run_dir)
    phases = 2 if rule in ("lopti", "ar_lopti") else 1  # Lopti: low-probability tokens, then the rest
    assert run.steps["n_updates"].tolist() == [phases, phases]
    assert sorted(run.tokens()["update_id"].unique()) == list(range(phases))
    assert run.meta["weighting"]["name"] == rule
    assert run.meta["config"]["weighting"] == rule
    tok = run.tokens(where="in_loss")
    assert tok["coef"].notna().all() and (tok["coef"] != 0).any()  # the letters task gives real gradients


def test_weighting_meta_holds_the_rules_params_and_curve(tmp_path):
    run = load_run(train(tiny(tmp_path, weighting="tr_grpo", weighting_params={"upper": 1.2}, steps=1)))
    w = run.meta["weighting"]
    assert w["params"] == {
        "alpha": 2.0,
        "k": 9.0,
        "mu": 0.25,
        "lower": 1.0,
        "upper": 1.2,
        "placement": "loss",
    }
    p, curve = w["curve"]["p"], w["curve"]["w"]
    assert len(p) == 101 and curve[0] == 1.0 and curve[-1] == pytest.approx(1.2)
    # w(0.2) = clip(2 * (sigmoid(1.8) - 0.25), 1, 1.2) = clip(2 * (0.85815 - 0.25), 1, 1.2) = 1.2163 -> 1.2
    assert curve[20] == pytest.approx(1.2)
    # w(0.1) = 2 * (sigmoid(0.9) - 0.25) = 2 * (0.71095 - 0.25) = 0.9219 -> clipped up to 1
    assert curve[10] == pytest.approx(1.0)


def test_first_update_is_on_policy_and_lopti_phases_split_at_eta(tmp_path):
    run = load_run(train(tiny(tmp_path, weighting="lopti", weighting_params={"eta": 0.004})))
    tok = run.tokens(where="in_loss AND step = 1")  # step 0 has all rewards 0, so no gradient
    assert (tok["advantage"] != 0).any()
    first = tok[tok.update_id == 0]
    # pi_old is scored with the weights and the log-prob function of the first update: ratio exactly 1
    assert (first["ratio"] == 1.0).all()
    assert (first["old_logprob"].map(torch.tensor).map(torch.exp) < 0.004).all()  # phase 1: p_old < eta
    second = tok[tok.update_id == 1]
    assert len(first) > 0 and len(second) > 0
    assert (second["old_logprob"].map(lambda x: float(torch.tensor(x).exp())) >= 0.004).all()
    assert (second["ratio"] - 1).abs().max() > 1e-4  # after the first update the policy moved


def test_same_seed_same_run_and_another_seed_differs(tmp_path):
    cfg = tiny(tmp_path, weighting="ar")
    a = load_run(train({**cfg, "run_dir": str(tmp_path / "a")}))
    b = load_run(train({**cfg, "run_dir": str(tmp_path / "b")}))
    c = load_run(train({**cfg, "run_dir": str(tmp_path / "c"), "seed": 1}))
    pd.testing.assert_frame_equal(a.steps.drop(columns=TIMING), b.steps.drop(columns=TIMING))
    cols = ["step", "update_id", "sample_id", "position", "token_id", "logprob", "coef", "weight"]
    ta, tb = (r.tokens(columns=cols).sort_values(cols[:4]).reset_index(drop=True) for r in (a, b))
    pd.testing.assert_frame_equal(ta, tb)
    pd.testing.assert_frame_equal(a.samples, b.samples)
    assert not a.samples["completion"].equals(c.samples["completion"])


def test_resume_continues_at_the_next_step_and_matches_an_uninterrupted_run(tmp_path):
    cfg = tiny(tmp_path, steps=4, weighting="tr_grpo")
    full = load_run(train({**cfg, "run_dir": str(tmp_path / "full")}))
    part = tiny(tmp_path, steps=2, weighting="tr_grpo", run_dir=str(tmp_path / "part"))
    train(part)
    with pytest.raises(ValueError, match="already holds a run"):
        train(part)
    with pytest.raises(ValueError, match=r"config keys \['lr'\] differ"):
        train({**part, "steps": 4, "resume": True, "lr": 0.5})
    resumed = load_run(train({**part, "steps": 4, "resume": True}))
    assert resumed.steps["step"].tolist() == [0, 1, 2, 3]
    pd.testing.assert_frame_equal(full.steps.drop(columns=TIMING), resumed.steps.drop(columns=TIMING))


def test_tool_output_tokens_are_recorded_but_out_of_the_loss(tmp_path):
    model, tok = load_model("tiny", seed=0)
    task = LettersTask()
    prompt = render_prompt(tok, task.train_problems(1, 0)[0])
    first = generate_completions(
        model, tok, [prompt], n_samples=1, max_new_tokens=1, sampling=sampling_kwargs(0.0, 1.0)
    ).completion_ids[0]
    stop = tok.decode(first)  # greedy decoding emits this first, so every first turn calls the tool
    reply = " <info>ok</info> "
    run = load_run(
        train(
            tiny(
                tmp_path,
                steps=1,
                prompts_per_step=1,
                temperature=0.0,
                max_turns=2,
                task_params={"tool_stop": stop, "reply": reply, "noisy": True},
            )
        )
    )
    rows = run.tokens().sort_values(["sample_id", "position"])
    info = rows[~rows.in_loss]
    n_reply = len(tok(reply, add_special_tokens=False).input_ids)  # 17 bytes -> 17 tokens
    assert len(info) == 2 * n_reply  # both samples got one reply
    assert "".join(info[info.sample_id == 0]["token"]) == reply
    assert (info["coef"] == 0).all() and (rows[rows.in_loss]["coef"] != 0).any()
    assert info["position"].min() == 1  # right after the stop token
    assert run.samples["n_tool_calls"].tolist() == [1, 1]
    assert (run.samples["completion"].str.contains("<info>ok</info>")).all()


def test_packed_left_padded_logprobs_match_each_sequence_alone():
    model, tok = load_model("tiny", seed=0)
    task = LettersTask()
    problems = [Problem("a", "", "1"), Problem("a much longer prompt than the first", "", "1")]
    torch.manual_seed(0)
    comps = generate_completions(
        model,
        tok,
        [render_prompt(tok, p) for p in problems],
        n_samples=2,
        max_new_tokens=6,
        sampling=sampling_kwargs(1.0, 1.0),
    )
    r = make_generation_batch(comps, task, problems, tok)
    assert r.prompt_len == max(len(p) for p in comps.prompt_ids) and r.rewards.shape == (2, 2)
    with torch.no_grad():
        logits, hidden = policy_forward(model, r.input_ids, r.attention_mask, r.prompt_len)
        packed = gather_logprobs(logits, r.completion_ids)  # [N, T]
        for i, (p, c) in enumerate(zip(comps.prompt_ids, comps.completion_ids)):
            alone = model(torch.tensor([p + c])).logits[0].log_softmax(-1)  # [P_i + T_i, V]
            want = alone[len(p) - 1 : -1].gather(-1, torch.tensor(c)[:, None])[:, 0]  # [T_i]
            assert torch.allclose(packed[i, : len(c)], want, atol=1e-5)
            assert r.mask[i].sum() == len(c)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_groups_shared_prompt_is_prefilled_once(monkeypatch, temperature):
    """G samples of a prompt start from one prefill of it (its keys and values repeated for the group):
    the same tokens and sampler log-probs as G separate prefills, greedy and sampled with one seed."""
    import tokengrad.train.prompt_sharing as sharing

    model, tok = load_model("tiny", seed=0)
    prompts = ["a", "a much longer prompt than the first"]
    shared, ran = sharing.shared_prefill, []

    def spy(*a):
        kwargs = shared(*a)
        ran.append(len(kwargs))
        return kwargs

    monkeypatch.setattr(sharing, "shared_prefill", spy)

    def completions():
        torch.manual_seed(1)
        return generate_completions(
            model, tok, prompts, n_samples=3, max_new_tokens=8, sampling=sampling_kwargs(temperature, 1.0)
        )

    got = completions()
    assert ran == [1]  # one cache handed to generate()
    monkeypatch.setattr(sharing, "shared_prefill", lambda *a: {})
    want = completions()
    assert got.completion_ids == want.completion_ids
    torch.testing.assert_close(
        torch.tensor(got.rollout_logprobs),
        torch.tensor(want.rollout_logprobs),
        equal_nan=True,
        atol=1e-6,
        rtol=0,
    )


def test_sampling_ignores_the_checkpoints_generation_defaults():
    model, tok = load_model("tiny", seed=0)
    greedy = generate_completions(
        model, tok, ["hello"], n_samples=1, max_new_tokens=6, sampling=sampling_kwargs(0.0, 1.0)
    ).completion_ids
    model.generation_config.repetition_penalty = 5.0  # would change what greedy decoding picks
    again = generate_completions(
        model, tok, ["hello"], n_samples=1, max_new_tokens=6, sampling=sampling_kwargs(0.0, 1.0)
    ).completion_ids
    assert again == greedy and model.generation_config.repetition_penalty == 5.0


def test_grad_accumulation_gives_the_gradient_of_one_pass(tmp_path):
    for aggregation in ("grpo", "dapo", "dr_grpo"):
        norms = []
        for accum in (1, 2):
            run = load_run(
                train(
                    tiny(
                        tmp_path,
                        name=f"{aggregation}{accum}",
                        steps=1,
                        group_size=4,
                        grad_accum=accum,
                        aggregation=aggregation,
                        max_new_tokens=6,
                    )
                )
            )
            layers = run.layers
            norms.append(layers[layers.layer == schema.TOTAL_LAYER]["grad_norm"].item())
            assert run.tokens()["pass_id"].nunique() == accum and run.steps["n_updates"].item() == 1
        assert norms[0] > 0 and norms[1] == pytest.approx(norms[0], rel=1e-5), aggregation


def test_micro_batch_share_by_aggregation():
    full = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]).float()  # 8 loss tokens in 3 rows
    micro = full[:2]  # 4 tokens in 2 rows
    assert micro_batch_share("dapo", micro, full) == pytest.approx(4 / 8)
    assert micro_batch_share("grpo", micro, full) == pytest.approx(2 / 3)
    assert micro_batch_share("dr_grpo", micro, full) == pytest.approx(2 / 3)


def test_mu_passes_and_kl_to_the_reference(tmp_path):
    run = load_run(train(tiny(tmp_path, num_iterations=2, beta=0.1)))
    assert run.steps["n_updates"].tolist() == [2, 2]
    tok = run.tokens(where="step = 0")
    assert sorted(tok["update_id"].unique()) == [0, 1]
    # step 0 starts at the reference weights: log pi_ref = log pi_old, so the KL is 0 there
    assert (tok["ref_logprob"] - tok["old_logprob"]).abs().max() < 1e-6
    assert run.steps["kl"].iloc[0] < run.steps["kl"].iloc[1] and run.steps["kl"].iloc[1] > 0


def test_dynamic_sampling_drops_groups_with_equal_rewards(tmp_path):
    run = load_run(
        train(tiny(tmp_path, dynamic_sampling=True, task_params={"constant": True}, checkpoint=False))
    )
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert run.steps["n_updates"].tolist() == [0, 0]
    assert run.files("tokens") == []
    assert run.samples["in_update"].tolist() == [0] * 8 and (run.samples["reward"] == 0.5).all()


def test_warmup_lr_evals_buckets_and_samples(tmp_path):
    run = load_run(
        train(
            tiny(
                tmp_path,
                steps=3,
                warmup_steps=2,
                lr=0.01,
                eval_every=2,
                eval_per_difficulty=2,
                bucket_every=2,
            )
        )
    )
    assert run.steps["lr"].tolist() == pytest.approx([0.005, 0.01, 0.01])  # lr * min(1, (step + 1) / 2)
    ev = run.evals
    assert ev["step"].tolist() == [1, 1, 2, 2] and ev["difficulty"].tolist() == ["1", "2", "1", "2"]
    assert (ev["n"] == 2).all() and ev["accuracy"].between(0, 1).all()
    assert sorted(run.buckets["step"].unique()) == [0, 2]
    assert run.buckets["dprob_mean"].notna().any()
    s = run.samples
    assert set(s.columns) >= {"correct", "answer", "meta_round", "n_tool_calls", "in_update"}
    assert s["task"].eq("letters").all() and s["length"].between(1, 8).all()
    steps = run.steps
    assert {
        "time_generate",
        "time_score",
        "time_update",
        "time_record",
        "reward_mean",
        "reward_std",
        "clip_frac",
        "weight_mean",
        "grad_norm",
        "loss",
    } <= set(steps.columns)
    assert steps["reward_mean"].tolist() == pytest.approx(s.groupby("step")["reward"].mean().tolist())


def test_real_task_kk_with_eval_by_number_of_people(tmp_path):
    run_dir = train(
        tiny(
            tmp_path,
            task="kk",
            task_params={"n_people": [2, 3]},
            eval_every=1,
            eval_per_difficulty=1,
            steps=1,
            prompts_per_step=1,
            max_new_tokens=4,
            bf16=True,
        )
    )
    check_run(run_dir, steps=1)
    run = load_run(run_dir)
    assert run.evals["difficulty"].tolist() == ["2", "3"] and run.evals["task"].eq("kk").all()
    assert (run.samples["reward"] == -3).all()  # Logic-RL's format penalty for random text


def test_eval_max_new_tokens_sets_the_held_out_generation_length(tmp_path, monkeypatch):
    import tokengrad.train.trainer as trainer_module

    lengths = []
    real = trainer_module.evaluate

    def spy(model, tok, task, **kwargs):
        lengths.append(kwargs["max_new_tokens"])
        return real(model, tok, task, **kwargs)

    monkeypatch.setattr(trainer_module, "evaluate", spy)
    common = dict(steps=1, prompts_per_step=1, eval_every=1, eval_per_difficulty=1, max_new_tokens=3)
    train(tiny(tmp_path, "own", eval_max_new_tokens=7, **common))
    train(tiny(tmp_path, "same", **common))  # 0: the training length
    assert lengths == [7, 3]


def test_real_tool_task_runs(tmp_path):
    run_dir = train(
        tiny(tmp_path, task="toolqa", steps=1, prompts_per_step=1, max_new_tokens=4, max_turns=2, bf16=True)
    )
    check_run(run_dir, steps=1)


def test_errors_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="unknown config key"):
        train(tiny(tmp_path, stepz=3))
    with pytest.raises(ValueError, match="cannot resume: no checkpoint"):
        train(tiny(tmp_path, resume=True))
    with pytest.raises(ValueError, match="bad task_params"):
        train(tiny(tmp_path, task_params={"no_such_param": 1}))
    assert not (tmp_path / "run").exists()


def test_cli_train(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'model = "tiny"\ntask = "letters"\nsteps = 1\nprompts_per_step = 1\ngroup_size = 2\n'
        "max_new_tokens = 4\nprogress = false\n"
    )
    assert cli_train([str(cfg), "weighting=ar", "--run-dir", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert load_run(tmp_path / "cli").meta["weighting"]["name"] == "ar"
    with pytest.raises(ValueError, match="config key 'weighting' = 'nope': unknown name"):
        cli_train([str(cfg), "weighting=nope"])  # `tokengrad train` turns it into one line, exit 2
