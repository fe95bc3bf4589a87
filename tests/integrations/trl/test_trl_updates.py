"""The TRL integration over TRL's update schedule, against an unmodified GRPOTrainer: TRL's own clip per
token, step scalars as the mean over the step's updates, bucket gradients of an update that spans
generation batches, exact statistics of confident tokens, and the rule parameters taken from the trainer."""

import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from test_trl import as_matrix, make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.integrations.trl.logs import column  # noqa: E402

pytestmark = pytest.mark.trl
EPS = 2e-3  # a clip this tight is crossed on the second, off-policy update of these tiny runs
LOSS_TYPES = ["dr_grpo", "dapo", "grpo"]


def capture_metric(trainer, name):
    """TRL's own per-micro-batch metric `name`, read right after each training compute_loss."""
    seen = []
    inner = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        loss = inner(model, inputs, *args, **kwargs)
        if torch.is_grad_enabled() and model.training:
            seen.append(trainer._metrics["train"][name][-1])
        return loss

    trainer.compute_loss = compute_loss
    return seen


def ppo_clipped_reference(rows, eps_low, eps_high):
    """TRL's region test from the recorded log-probs and advantages, written out independently."""
    r = np.exp(rows.logprob.astype(np.float64) - rows.old_logprob.astype(np.float64))
    a = rows.advantage.to_numpy()
    return ((r < 1 - eps_low) & (a < 0)) | ((r > 1 + eps_high) & (a > 0))


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_clip_and_step_scalars_follow_trl(tmp_path, loss_type):
    beta = 0.04 if loss_type == "grpo" else 0.0
    trainer = make_trainer(
        tmp_path,
        loss_type,
        num_iterations=2,
        gradient_accumulation_steps=2,
        beta=beta,
        epsilon=EPS,
        temperature=0.7,
    )
    tg_trl.attach(trainer, tmp_path / "run")
    per_pass = capture_metric(trainer, "clip_ratio/region_mean")
    trainer.train()
    run = load_run(tmp_path / "run")
    tokens = run.tokens()
    assert len(per_pass) == 4 and tokens.pass_id.nunique() == 4  # 2 updates x 2 micro-batches, one step
    np.testing.assert_array_equal(tokens.clipped.to_numpy(bool), ppo_clipped_reference(tokens, EPS, EPS))
    assert tokens.clipped.any() and not tokens.clipped.all()
    # the mean of `clipped` over a micro-batch's loss tokens is TRL's clip_ratio/region_mean for it
    got = tokens[tokens.in_loss].groupby("pass_id").clipped.mean().to_numpy()
    np.testing.assert_allclose(got, per_pass, rtol=1e-6)
    # step scalars: the mean over the step's two updates, not the last TRL log; the attach's own values
    # (float64 over TRL's float32 tensors) and TRL's logs joined as trl_* (each log weighted by its update)
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    assert len(logs) == 2 and logs[0]["learning_rate"] != logs[1]["learning_rate"]
    step = run.steps.iloc[0]
    pairs = [("loss", "loss"), ("lr", "learning_rate"), ("clip_frac", "clip_ratio/region_mean")]
    for col, key in pairs + ([("kl", "kl")] if beta else []):
        want = np.mean([h[key] for h in logs])
        assert step[col] == pytest.approx(want, rel=1e-6, abs=1e-12), col
        assert step[f"trl_{column(key)}"] == pytest.approx(want, rel=1e-9, abs=1e-12), col
    assert step.trl_log_updates == 2 and step.trl_log_from_step == 0
    assert step.trl_global_step == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss_type, overrides, metric",
    [
        # sequence log-ratios here are about +-0.4 to 0.75: a clip of 0.45 keeps some sequences, not all
        ("grpo", dict(importance_sampling_level="sequence", epsilon=0.45), "clip_ratio/region_mean"),
        ("cispo", dict(epsilon_high=1.0), "cispo_clip_ratio"),
    ],
)
def test_clip_of_sequence_level_and_cispo(tmp_path, loss_type, overrides, metric):
    trainer = make_trainer(tmp_path, loss_type, num_iterations=2, **overrides)
    tg_trl.attach(trainer, tmp_path / "run")
    per_pass = capture_metric(trainer, metric)
    trainer.train()
    tokens = load_run(tmp_path / "run").tokens()
    off = tokens[tokens.pass_id == 1]  # the off-policy pass
    if loss_type == "cispo":  # min(r, eps_high) caps r above eps_high for A > 0
        r = np.exp(off.logprob.astype(np.float64) - off.old_logprob.astype(np.float64))
        want = (r > 1.0) & (off.advantage.to_numpy() > 0)
        np.testing.assert_array_equal(off.clipped.to_numpy(bool), want)
        got = tokens[tokens.in_loss].groupby("pass_id").clipped.mean().to_numpy()
    else:  # GSPO: one flag per sequence from its mean log-ratio; TRL's metric is a mean over sequences
        assert (off.groupby("sample_id").clipped.nunique() == 1).all()
        seq = tokens.groupby(["pass_id", "sample_id"])
        log_r = seq.apply(
            lambda g: (g.logprob.astype(np.float64) - g.old_logprob).mean(), include_groups=False
        )
        adv = seq.advantage.first()
        eps = overrides["epsilon"]
        want = ((np.exp(log_r) < 1 - eps) & (adv < 0)) | ((np.exp(log_r) > 1 + eps) & (adv > 0))
        np.testing.assert_array_equal(seq.clipped.first().to_numpy(bool), want.to_numpy())
        got = seq.clipped.first().groupby("pass_id").mean().to_numpy()
    assert off.clipped.any() and not off.clipped.all()
    np.testing.assert_allclose(got, per_pass, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_buckets_of_an_update_spanning_generation_batches(tmp_path, loss_type):
    # gradient accumulation 4 > steps_per_generation 1 x num_iterations 2: one update over two generations
    beta = 0.04 if loss_type == "grpo" else 0.0
    trainer = make_trainer(
        tmp_path,
        loss_type,
        max_steps=1,
        gradient_accumulation_steps=4,
        steps_per_generation=1,
        num_iterations=2,
        beta=beta,
        temperature=0.1,
    )
    tg_trl.attach(trainer, tmp_path / "run", buckets=1)
    trainer.train()
    run = load_run(tmp_path / "run")
    assert run.steps.step.tolist() == [0, 1]
    b = run.buckets
    assert b.step.unique().tolist() == [1] and b.update_id.unique().tolist() == [0]  # where the update is
    # the buckets hold every micro-batch of the update: their shares and the (zero) residual add up to it
    residual = float(b[b.bucket == "residual"].update_share.iloc[0])
    assert abs(residual) < 1e-5
    assert b.update_share.sum() == pytest.approx(1.0, abs=1e-5)
    assert b.n_tokens.sum() == int(run.tokens(columns=["in_loss"]).in_loss.sum())


@pytest.mark.slow
def test_spanning_update_keeps_the_bucket_schedule_of_its_first_step(tmp_path):
    # buckets=2 analyses steps 0 and 2; the updates begun there end in steps 1 and 3, analysed too
    trainer = make_trainer(
        tmp_path,
        "dapo",
        max_steps=2,
        gradient_accumulation_steps=4,
        steps_per_generation=1,
        num_iterations=2,
        temperature=0.1,
    )
    tg_trl.attach(trainer, tmp_path / "run", buckets=2)
    trainer.train()
    run = load_run(tmp_path / "run")
    b = run.buckets
    assert run.steps.step.tolist() == [0, 1, 2, 3] and b.step.unique().tolist() == [1, 3]
    for _, rows in b.groupby("step"):
        assert rows.update_share.sum() == pytest.approx(1.0, abs=1e-5)
        assert abs(float(rows[rows.bucket == "residual"].update_share.iloc[0])) < 1e-5
    tokens = run.tokens(columns=["step", "in_loss"])
    assert b.n_tokens.sum() == int(tokens.in_loss.sum())


def test_confident_token_stats_match_float64(tmp_path):
    # temperature 0.015 makes most of the tiny model's tokens near-certain (1 - p down to 1e-7 and below),
    # where sqrt(1 - 2p + sum p^2) from the fused head's outputs would cancel to 0
    trainer = make_trainer(tmp_path, "dapo", max_steps=1, temperature=0.015)
    tg_trl.attach(trainer, tmp_path / "run")
    refs = []
    inner = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        if torch.is_grad_enabled() and model.training:  # float64 of the logits the recorded pass sees
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            T = inputs["completion_ids"].size(1)
            with torch.no_grad():
                z = model(input_ids=ids, attention_mask=att).logits[:, -T - 1 : -1].double() / 0.015
            p = torch.softmax(z, -1)  # [B, T, V]
            py = p.gather(-1, inputs["completion_ids"].unsqueeze(-1))  # [B, T, 1]
            grad = p.scatter(-1, inputs["completion_ids"].unsqueeze(-1), py - 1.0)  # p - e_y
            refs.append((inputs, grad.norm(dim=-1), 1.0 - py.squeeze(-1)))
        return inner(model, inputs, *args, **kwargs)

    trainer.compute_loss = compute_loss
    trainer.train()
    tokens = load_run(tmp_path / "run").tokens()
    ((inputs, unit, q),) = refs
    mask = inputs["completion_mask"].bool()
    sid = inputs[tg_trl.SAMPLE_KEY]
    got = as_matrix(tokens, "logit_grad_unit", sid, mask.shape)
    assert q[mask].min() < 1e-7 and (q[mask] < 1e-4).sum() > 5  # confident tokens are really there
    torch.testing.assert_close(got[mask], unit[mask], rtol=1e-4, atol=0)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_rule_parameters_come_from_the_trainer(tmp_path, beta):
    trainer = make_trainer(tmp_path, "dapo", epsilon=0.1, epsilon_high=0.3, beta=beta)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = tg_trl.attach(trainer, tmp_path / "run", weighting="clip_cov")
    kl_warnings = [w for w in caught if "KL penalty" in str(w.message)]
    assert len(kl_warnings) == (1 if beta else 0)
    params = rec.rule[1]
    assert (params["eps_low"], params["eps_high"]) == (0.1, 0.3)  # TRL's epsilons, not the rule's 0.2/0.2
    rec.detach()
    assert load_run(tmp_path / "run").meta["weighting"]["params"]["eps_high"] == 0.3
    with pytest.raises(ValueError, match="epsilon_low=0.1"):
        tg_trl.attach(
            make_trainer(tmp_path / "b", "dapo", epsilon=0.1),
            tmp_path / "run2",
            weighting="clip_cov",
            weighting_params={"eps_low": 0.2},
        )
