"""Faithful training math (issue 10): the sampled distribution, one log-prob path, the update schedule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from letters_task import LettersTask

from tokengrad import load_run, schema
from tokengrad.objective.loss import ROUNDING, policy_loss
from tokengrad.objective.weighting import WEIGHTINGS, TokenWeights
from tokengrad.train.tasks import TASKS, register_task
from tokengrad.train.trainer import train


def tiny(tmp_path, name="run", **overrides) -> dict:
    cfg = dict(
        model="tiny",
        task="letters",
        steps=1,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=8,
        lr=1e-2,
        bf16=False,
        progress=False,
        checkpoint=False,
        run_dir=str(tmp_path / name),
    )
    return {**cfg, **overrides}


class HalfTiedTask(LettersTask):
    """Every other prompt scores 0.5 for any completion (a tied, uninformative group); the others score the
    share of lowercase letters, as the letters task."""

    name = "half_tied"

    def reward(self, problem, completion):
        return 0.5 if problem.meta["round"] % 2 else super().reward(problem, completion)


if "half_tied" not in TASKS:
    register_task("half_tied")(HalfTiedTask)


# ---- 1. temperature and the sampler's own log-probs --------------------------------------------------
def test_recorded_probabilities_are_the_sampled_distribution_at_temperature_0_05(tmp_path):
    run = load_run(train(tiny(tmp_path, temperature=0.05)))
    assert run.meta["temperature"] == 0.05
    tok = run.tokens(where="in_loss")
    assert tok["rollout_logprob"].notna().all()
    # prob is softmax(z / 0.05): the distribution generate() sampled from, token by token
    sampled = tok["rollout_logprob"].map(math.exp)
    assert (tok["prob"] - sampled).abs().max() < 1e-4
    assert tok["prob"].median() > 0.5  # at T = 1 the tiny model gives every token about 1/259
    assert run.steps["rollout_mismatch"].item() < 1e-4
    # entropy and sum_p2 describe the same sharp distribution
    assert tok["entropy"].median() < 1.0 and tok["sum_p2"].median() > 0.25


def test_top_p_truncation_shows_as_rollout_mismatch(tmp_path):
    run = load_run(train(tiny(tmp_path, top_p=0.3)))
    tok = run.tokens(where="in_loss")
    # the nucleus renormalises over fewer tokens: the sampler's log-prob is never below the trained one
    assert (tok["rollout_logprob"] >= tok["logprob"] - 1e-5).all()
    gap = (tok["rollout_logprob"] - tok["old_logprob"]).abs().mean()
    assert run.steps["rollout_mismatch"].item() == pytest.approx(gap, rel=1e-4) and gap > 0.1


def test_greedy_runs_have_no_sampler_logprob_and_train_at_temperature_1(tmp_path):
    run = load_run(train(tiny(tmp_path, temperature=0.0, task_params={"noisy": True})))
    assert run.meta["temperature"] == 1.0
    assert run.tokens()["rollout_logprob"].isna().all() and run.steps["n_nonfinite"].item() == 0


# ---- 2. one log-prob path ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        dict(weighting="kl_cov", grad_accum=2),
        dict(mini_batches=2, beta=0.1),
        dict(temperature=0.7, weighting="cw_grpo", grad_accum=3),
    ],
)
def test_first_pass_ratio_is_exactly_one_on_every_token(tmp_path, extra):
    run = load_run(train(tiny(tmp_path, num_iterations=2, **extra)))
    tok = run.tokens()
    first = tok[tok.update_id == 0]
    assert len(first) > 0 and (first["ratio"] == 1.0).all()
    assert (first["logprob"] == first["old_logprob"]).all()
    later = tok[tok.update_id == tok.update_id.max()]
    assert (later["ratio"] != 1.0).any()  # the policy moved


def test_kl_cov_penalty_is_zero_below_rounding():
    old = torch.tensor([[-2.0, -2.0, -2.0]])
    tiny_shift = 0.5 * ROUNDING * 3.0  # below the tolerance (1 + |log pi_old|) * ROUNDING at log pi_old = -2
    lp = (old + torch.tensor([[tiny_shift, -tiny_shift, 1e-3]])).requires_grad_()
    coef = TokenWeights(kl_cov_coef=torch.ones(1, 3))
    mask = torch.ones(1, 3)
    out = policy_loss(lp, old, torch.zeros(1), mask, coef, aggregation="dapo", ppo_clip=False)
    assert out.per_token_loss[0, :2].tolist() == [0.0, 0.0]
    assert out.per_token_loss[0, 2].item() == pytest.approx(1e-3, rel=1e-3)
    out.loss.backward()
    assert lp.grad[0, :2].tolist() == [0.0, 0.0] and lp.grad[0, 2].item() == pytest.approx(1 / 3)


def test_rule_switches_the_ppo_clip_off():
    assert WEIGHTINGS["kl_cov"].ppo_clip is False and WEIGHTINGS["grpo"].ppo_clip is True
    old = torch.zeros(1, 2)
    lp = torch.log(torch.tensor([[2.0, 0.5]])).requires_grad_()  # ratios 2 and 0.5
    adv = torch.tensor([[1.0, -1.0]])
    clipped = policy_loss(lp, old, adv, torch.ones(1, 2), aggregation="dapo")
    assert clipped.clipped.tolist() == [[True, True]]
    free = policy_loss(lp, old, adv, torch.ones(1, 2), aggregation="dapo", ppo_clip=False)
    assert free.clipped.tolist() == [[False, False]]
    free.loss.backward()
    # d(-r A / 2)/d log pi = -r A / 2
    assert lp.grad[0].tolist() == pytest.approx([-1.0, 0.25])


# ---- 5. dynamic sampling that refills -------------------------------------------------------------------
def test_dynamic_sampling_refills_until_the_batch_holds_informative_groups(tmp_path):
    base = tiny(tmp_path, task="half_tied", steps=2, dynamic_sampling=True)
    once = load_run(train({**base, "run_dir": str(tmp_path / "once")}))
    # one round of 2 prompts: prompt 0 informative, prompt 1 tied -> filtered to 1 group
    assert once.steps["groups_generated"].tolist() == [2, 2] and once.steps["groups_kept"].tolist() == [1, 1]
    refill = load_run(train({**base, "run_dir": str(tmp_path / "refill"), "max_gen_batches": 3}))
    # a second round brings the second informative group; then generation stops
    assert refill.steps["gen_rounds"].tolist() == [2, 2]
    assert refill.steps["groups_generated"].tolist() == [4, 4]
    assert refill.steps["groups_kept"].tolist() == [2, 2]
    s = refill.samples[refill.samples.step == 0].sort_values("sample_id")
    assert s["sample_id"].tolist() == list(range(16)) and s["group_id"].tolist() == [
        g for g in range(4) for _ in range(4)
    ]
    kept = s[s.in_update == 1]
    assert sorted(kept["group_id"].unique()) == [0, 2]  # the informative groups of rounds 0 and 1
    assert (s[s.in_update == 0]["reward"] == 0.5).all()
    tok = refill.tokens(where="step = 0")
    assert sorted(tok["group_id"].unique()) == [0, 2]
    assert len(kept["prompt"].unique()) == 2


def test_refill_gives_up_after_max_gen_batches(tmp_path):
    cfg = tiny(tmp_path, dynamic_sampling=True, max_gen_batches=3, task_params={"constant": True})
    run = load_run(train(cfg))
    assert run.steps["gen_rounds"].item() == 3 and run.steps["groups_generated"].item() == 6
    assert run.steps["groups_kept"].item() == 0 and run.steps["n_updates"].item() == 0
    assert len(run.samples) == 24 and (run.samples["in_update"] == 0).all()


def test_schema_documents_the_new_columns():
    for table, name in [
        ("tokens", "rollout_logprob"),
        ("steps", "rollout_mismatch"),
        ("steps", "groups_generated"),
        ("steps", "groups_kept"),
        ("steps", "gen_rounds"),
    ]:
        assert name in schema.column_names(table)


# ---- 3. PPO mini-batches -------------------------------------------------------------------------------
def test_mini_batches_are_optimizer_steps_over_disjoint_rows(tmp_path):
    run = load_run(
        train(
            tiny(
                tmp_path, mini_batches=2, num_iterations=2, weighting="lopti", weighting_params={"eta": 0.004}
            )
        )
    )
    assert run.steps["n_updates"].item() == 2 * 2 * 2  # phases x epochs x mini-batches
    tok = run.tokens()
    rows = {u: set(t["sample_id"]) for u, t in tok.groupby("update_id")}
    assert rows[0] == {0, 1, 2, 3} and rows[1] == {4, 5, 6, 7}  # contiguous halves, disjoint
    assert rows[2] == rows[0] and rows[3] == rows[1]  # the second epoch sweeps them again
    layers = run.layers[run.layers.layer == schema.TOTAL_LAYER]
    assert sorted(layers["update_id"]) == list(range(8))
    # on-policy for the first mini-batch only: the second one is trained after an optimizer step
    assert (tok[tok.update_id == 0]["ratio"] == 1.0).all() and (tok[tok.update_id == 1]["ratio"] != 1.0).any()


def test_a_mini_batch_update_is_the_gradient_of_its_rows_alone(tmp_path):
    """Update 0 of a run with 2 mini-batches equals the single update of a run on its rows alone: the loss
    of a mini-batch is normalised over the mini-batch."""
    split = load_run(train(tiny(tmp_path, "split", mini_batches=2, aggregation="dapo")))
    t = split.tokens(where="update_id = 0")
    total = split.layers[(split.layers.layer == schema.TOTAL_LAYER) & (split.layers.update_id == 0)]
    # the same rows' coefficients, summed, against the token-mean over the mini-batch's loss tokens
    n_tokens = int(t["in_loss"].sum())
    adv_sum = float((-t[t.in_loss]["advantage"] * t[t.in_loss]["ratio"]).sum()) / n_tokens
    assert float(t[t.in_loss]["coef"].sum()) == pytest.approx(adv_sum, rel=1e-4)
    assert total["grad_norm"].item() > 0


# ---- 4. dual-clip ---------------------------------------------------------------------------------------
def test_dual_clip_bounds_the_loss_of_negative_advantages():
    old = torch.zeros(1, 4)
    r = torch.tensor([[5.0, 5.0, 1.1, 2.0]])
    adv = torch.tensor([[-1.0, 1.0, -1.0, -1.0]])
    lp = r.log().requires_grad_()
    out = policy_loss(lp, old, adv, torch.ones(1, 4), aggregation="dapo", clip_ratio_c=3.0)
    # A < 0, r = 5: PPO gives -min(5 * -1, 1.2 * -1) = 5; dual-clip caps it at -c A = 3 (no gradient)
    # A > 0, r = 5: clipped at 1.2 as usual (loss -1.2); A < 0, r = 1.1: inside the range (loss 1.1)
    # A < 0, r = 2: loss 2 < 3, the dual clip does not bind
    assert out.per_token_loss[0].tolist() == pytest.approx([3.0, -1.2, 1.1, 2.0])
    assert out.clipped[0].tolist() == [True, True, False, False]
    out.loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.1 / 4, 2.0 / 4])
    plain = policy_loss(lp, old, adv, torch.ones(1, 4), aggregation="dapo")
    assert plain.per_token_loss[0, 0].item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(lp, old, adv, torch.ones(1, 4), clip_ratio_c=0.5)


def test_clip_ratio_c_config_key(tmp_path):
    from tokengrad.train.config import make_config

    assert make_config({"clip_ratio_c": 3}).clip_ratio_c == 3.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        make_config({"clip_ratio_c": 0.9})
    run = load_run(train(tiny(tmp_path, clip_ratio_c=3.0, num_iterations=2)))
    assert run.meta["config"]["clip_ratio_c"] == 3.0 and run.steps["n_updates"].item() == 2


# ---- 6. batch statistics once per update ---------------------------------------------------------------
def _rules_by_cost():
    """Rules with batch statistics run in the default tier; pointwise rules (equal by construction, their
    weights need no batch statistic) in the slow tier."""
    return [
        pytest.param(r, marks=pytest.mark.slow) if WEIGHTINGS[r].pointwise else r for r in sorted(WEIGHTINGS)
    ]


@pytest.mark.parametrize("rule", _rules_by_cost())
def test_grad_accum_does_not_change_the_update(tmp_path, rule):
    runs = []
    for accum in (1, 4):
        runs.append(
            load_run(
                train(
                    tiny(
                        tmp_path,
                        f"a{accum}",
                        weighting=rule,
                        grad_accum=accum,
                        num_iterations=2,
                        aggregation="dapo",
                    )
                )
            )
        )
    one, four = runs
    assert four.tokens()["pass_id"].nunique() == 4 * one.tokens()["pass_id"].nunique()
    norms = [
        r.layers[r.layers.layer == schema.TOTAL_LAYER].sort_values("update_id")["grad_norm"].tolist()
        for r in runs
    ]
    assert norms[0][0] > 0 and norms[1] == pytest.approx(norms[0], rel=1e-4)
    cols = ["update_id", "sample_id", "position", "coef", "weight"]
    a, b = (r.tokens(columns=cols).sort_values(cols[:3]).reset_index(drop=True) for r in runs)
    assert (a[cols[:3]] == b[cols[:3]]).all().all()
    assert b["weight"].to_numpy() == pytest.approx(a["weight"].to_numpy(), rel=1e-4, abs=1e-6)
    assert b["coef"].to_numpy() == pytest.approx(a["coef"].to_numpy(), rel=1e-3, abs=1e-7)


# ---- 7. Lopti's probability change ---------------------------------------------------------------------
def test_prob_change_covers_every_pass_bucketed_by_pi_old(tmp_path):
    from tokengrad.record.recorder import Recorder

    lp_old = torch.log(torch.tensor([[0.1, 0.6, 1.0, 0.9], [0.2, 0.3, 0.8, 0.7]]))  # [2, 4]
    adv = torch.tensor([1.0, 0.0])
    phase1 = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]]).float()  # pi_old < 0.25
    phase2 = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]]).float()
    model = torch.nn.Linear(1, 1)
    with Recorder(tmp_path / "r", model=model) as rec:
        with rec.step(0) as st:
            for update_id, phase in enumerate((phase1, phase2)):
                lp = lp_old.clone().requires_grad_()
                st.track(
                    lp,
                    token_ids=torch.zeros(2, 4, dtype=torch.long),
                    loss_mask=phase,
                    old_logprobs=lp_old,
                    advantages=adv,
                    update_id=update_id,
                )
                (lp * phase).sum().backward()
            new = lp_old + torch.tensor([[0.1, -0.1, 0.0, 0.05], [0.3, 0.3, -0.2, 0.0]])
            st.record_prob_change(new, sample_ids=torch.tensor([0, 1]))
    b = load_run(tmp_path / "r").buckets.sort_values("lo")
    assert b["update_id"].tolist() == [1, 1, 1, 1]  # the step's last update
    assert b["n_tokens"].tolist() == [2, 1, 2, 3]  # pi_old: 0.1, 0.2 | 0.3 | 0.6, 0.7 | 1.0, 0.9, 0.8
    # row 1 has A = 0: left out of the change; row 0: 0.1 -> 0.1 e^0.1, 0.6 -> 0.6 e^-0.1, 0.9 -> 0.9 e^0.05
    dp = b["dprob_mean"].tolist()
    assert dp[0] == pytest.approx(0.1 * (math.exp(0.1) - 1))
    assert math.isnan(dp[1])
    assert dp[2] == pytest.approx(0.6 * (math.exp(-0.1) - 1))
    assert dp[3] == pytest.approx((0.0 + 0.9 * (math.exp(0.05) - 1)) / 2)  # p = 1 stays, p = 0.9 rises
    # correct ratio: A > 0 tokens whose log-prob rose; the token at p = 1 cannot rise and is left out
    assert b["correct_ratio"].tolist()[0] == 1.0 and b["correct_ratio"].tolist()[2] == 0.0
    assert b["correct_ratio"].tolist()[3] == 1.0


# ---- refusals and labels -------------------------------------------------------------------------------
CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("tiny_*"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_tiny_configs_have_reward_spread_and_a_gradient(tmp_path, path):
    run = load_run(
        train(
            str(path),
            steps=1,
            eval_every=0,
            bucket_every=0,
            checkpoint=False,
            progress=False,
            run_dir=str(tmp_path / "run"),
        )
    )
    assert run.steps["reward_std"].item() > 0 and run.steps["grad_norm"].item() > 0


def test_charset_reward_is_the_share_of_the_asked_class():
    from tokengrad.train.tasks import get_task

    task = get_task("charset", classes=["digit"])
    p = task.train_problems(1, 0)[0]
    assert p.answer == "digit" and "digits" in p.prompt
    assert task.reward(p, "12ab") == 0.5 and task.reward(p, "") == 0.0 and task.is_correct(p, "123a")
    with pytest.raises(ValueError, match="charset classes"):
        get_task("charset", classes=["emoji"])


def test_closing_line_counts_steps_without_gradient(tmp_path, capsys):
    train(tiny(tmp_path, "tied", steps=2, task_params={"constant": True}))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "2 steps, 2 with zero gradient (2 with tied rewards" in line
    train(tiny(tmp_path, "live", steps=1))
    assert "1 steps, 0 with zero gradient;" in capsys.readouterr().err


def test_tr_grpo_ratio_placement_warns_when_the_weight_exceeds_the_clip(tmp_path):
    from tokengrad.objective.weighting import check_rule

    assert check_rule("tr_grpo", {}, eps_low=0.2, eps_high=0.2) == []  # placement "loss"
    msgs = check_rule("tr_grpo", {"placement": "ratio"}, eps_low=0.2, eps_high=0.2)
    assert len(msgs) == 1 and "p > 0.19" in msgs[0]
    assert check_rule("tr_grpo", {"placement": "ratio"}, eps_low=0.2, eps_high=0.4) == []
    with pytest.warns(UserWarning, match="upper=1.4 > 1 \\+ eps_high = 1.2"):
        train(tiny(tmp_path, weighting="tr_grpo", weighting_params={"placement": "ratio"}))
    # the documented threshold: w(p) = 2 (sigmoid(9 p) - 0.25) crosses 1.2 at p = ln(0.85 / 0.15) / 9
    p = math.log(0.85 / 0.15) / 9
    assert p == pytest.approx(0.1927, abs=1e-4)
    assert 2 * (1 / (1 + math.exp(-9 * p)) - 0.25) == pytest.approx(1.2)


def test_head_grad_norm_doc_names_the_tied_embedding_path():
    doc = {c.name: c.doc for c in schema.TOKENS}["head_grad_norm"]
    assert "tied" in doc and "embedding" in doc


def test_requires_python_311():
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["requires-python"] == ">=3.11"
