"""The built-in trainer's rollout correction (`rollout_correction`, TRL 1.16's vllm_importance_sampling_mode):
the config keys, the weights against TRL's arithmetic, the loss they enter, and tiny trainer runs whose
sampler differs from the trainer (bf16 generation, top-p) so that the correction truncates or masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from letters_task import LettersTask  # noqa: F401  (registers the "letters" task)

from tokengrad import load_run
from tokengrad.objective import rollout_correction as rc
from tokengrad.objective.loss import policy_loss
from tokengrad.train import correction
from tokengrad.train.batch import Batch
from tokengrad.train.config import describe_config, make_config
from tokengrad.train.trainer import train


def trl_reference(old, rollout, mask, mode, clip_max, clip_min=None):
    """TRL 1.16's importance_sampling_ratio, written out as grpo_trainer.py ~L2660-2705 computes it."""
    d = torch.nan_to_num((old - rollout) * mask, nan=0.0)
    if mode.startswith("sequence"):
        d = d.sum(-1, keepdim=True)
    r = torch.exp(d)
    if mode.endswith("truncate"):
        return torch.clamp(r, min=clip_min, max=clip_max)
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    return r.masked_fill((r < lo) | (r > hi), 0.0)


def batch_of(old, rollout, mask, adv) -> Batch:
    n, t = old.shape
    return Batch(
        input_ids=torch.zeros(n, t + 1, dtype=torch.long),
        attention_mask=torch.ones(n, t + 1),
        prompt_len=1,
        completion_ids=torch.zeros(n, t, dtype=torch.long),
        mask=mask,
        loss_mask=mask,
        advantages=adv,
        old_logprobs=old,
        ref_logprobs=None,
        rollout_logprobs=rollout,
        is_weights=None,
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 2,
    )


# ---- config -------------------------------------------------------------------------------------------
def test_config_defaults_off_and_names_follow_trl():
    cfg = make_config({})
    assert cfg.rollout_correction == "off" and correction.correction_of(cfg) is None
    corr = correction.correction_of(make_config({"rollout_correction": "sequence_mask"}))
    assert corr == rc.RolloutCorrection("sequence_mask", clip_max=3.0, clip_min=None)  # TRL's defaults
    text = describe_config()
    assert "one of: off, sequence_mask, sequence_truncate, token_mask, token_truncate" in text
    assert "vllm_importance_sampling_clip_max" in text


def test_config_refuses_unknown_modes_and_bad_bounds():
    with pytest.raises(ValueError, match=r"unknown name 'seq_mask'; known: \['off', 'sequence_mask'"):
        make_config({"rollout_correction": "seq_mask"})
    with pytest.raises(ValueError, match="is now 'rollout_correction_clip_max'"):
        make_config({"rollout_correction_cap": 3.0})
    with pytest.raises(ValueError, match="'rollout_correction_clip_min' = 2.0 must be below"):
        make_config({"rollout_correction_clip_min": 2.0, "rollout_correction_clip_max": 1.5})
    with pytest.raises(ValueError, match="rollout_correction_clip_max.*must be > 0"):
        make_config({"rollout_correction_clip_max": 0.0})


# ---- weights and loss on given tensors ------------------------------------------------------------------
def test_trl_4772_arithmetic_masks_the_sequence_and_zeroes_its_gradient():
    # per-token gaps of 0.012 and 0.005 over 100 tokens: TRL sums them to 1.2 and 0.5, so the sequence
    # ratios are exp(1.2) = 3.32 > 3.0 (masked) and exp(0.5) = 1.65 (kept)
    old = torch.full((2, 100), -2.0)
    rollout = old - torch.tensor([[0.012], [0.005]])
    mask, adv = torch.ones(2, 100), torch.tensor([1.0, -0.5])
    corr = correction.correction_of(make_config({"rollout_correction": "sequence_mask"}))
    b = correction.with_weights(batch_of(old, rollout, mask, adv), corr)
    assert b.is_weights.shape == (2, 1)
    assert b.is_weights[0].item() == 0.0 and b.is_weights[1].item() == pytest.approx(math.exp(0.5), rel=1e-4)
    torch.testing.assert_close(b.is_weights, trl_reference(old, rollout, mask, "sequence_mask", 3.0))
    cols = correction.token_columns(b, torch.arange(2), mask, corr)
    assert (
        cols["mask_codes"][0].eq(rc.MASK_BIT["is_sequence_mask"]).all() and cols["mask_codes"][1].eq(0).all()
    )
    lp = old.clone().requires_grad_()
    out = policy_loss(lp, old, adv, mask, aggregation="grpo", is_weight=b.is_weights.expand_as(lp))
    out.loss.backward()
    assert (lp.grad[0] == 0).all()
    # grpo: mean over 2 sequences of the token mean; d(-r A w)/d log pi = -A w at r = 1
    want = torch.full((100,), 0.5 * math.exp(0.5) / 100 / 2)
    torch.testing.assert_close(lp.grad[1], want, rtol=1e-4, atol=0)
    m = correction.step_metrics(b, corr)
    assert m["is_masked_sequences"] == 1 and m["is_masked_tokens"] == 100
    assert m["is_weight_min"] == 0.0 and m["is_weight_max"] == pytest.approx(math.exp(0.5), rel=1e-4)
    assert m["rollout_mismatch"] == pytest.approx(0.0085, rel=1e-4)
    assert m["rollout_mismatch_max"] == pytest.approx(0.012, rel=1e-4)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min", [0.0, 0.8])
def test_every_mode_equals_trls_arithmetic(mode, clip_min):
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(6, 9, generator=g) * 3
    rollout = old + 0.4 * torch.randn(6, 9, generator=g)
    rollout[0, 2] = float("nan")  # an unscored token: gap 0, as TRL
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    cfg = make_config(
        {
            "rollout_correction": mode,
            "rollout_correction_clip_max": 1.3,
            "rollout_correction_clip_min": clip_min,
        }
    )
    b = correction.with_weights(
        batch_of(old, rollout, mask, torch.randn(6, generator=g)), correction.correction_of(cfg)
    )
    want = trl_reference(old, rollout, mask, mode, 1.3, clip_min or None)
    torch.testing.assert_close(b.is_weights, want)
    assert b.is_weights.shape[-1] == (1 if mode.startswith("sequence") else 9)
    if mode.endswith("mask"):
        assert (want == 0).any() and (want > 0).any()  # the case masks some and keeps some
    m = correction.step_metrics(b, correction.correction_of(cfg))
    flat = want.flatten() if mode.startswith("sequence") else want[mask.bool()]
    assert m["is_weight_mean"] == pytest.approx(float(flat.double().mean()), rel=1e-6)  # TRL's logged mean
    assert m["n_rollout_nan"] == int(mask[0, 2])


def test_loss_without_weights_is_unchanged_and_bad_weights_raise():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(3, 5, generator=g)
    lp = (old + 0.1 * torch.randn(3, 5, generator=g)).requires_grad_()
    adv, mask = torch.randn(3, generator=g), torch.ones(3, 5)
    plain = policy_loss(lp, old, adv, mask, aggregation="dapo")
    ones = policy_loss(lp, old, adv, mask, aggregation="dapo", is_weight=torch.ones(3, 5))
    assert plain.loss.item() == ones.loss.item()
    w = torch.rand(3, 5, generator=g) * 2
    weighted = policy_loss(lp, old, adv, mask, aggregation="dapo", is_weight=w)
    torch.testing.assert_close(weighted.per_token_loss, plain.per_token_loss * w)
    with pytest.raises(ValueError, match="is_weight must be >= 0"):
        policy_loss(lp, old, adv, mask, is_weight=-w)
    with pytest.raises(ValueError, match=r"is_weight=\[3, 1\]"):
        policy_loss(lp, old, adv, mask, is_weight=w[:, :1])


# ---- the trainer ----------------------------------------------------------------------------------------
def tiny(tmp_path, **overrides) -> dict:
    cfg = dict(
        model="tiny",
        task="letters",
        steps=1,
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=8,
        lr=1e-2,
        progress=False,
        checkpoint=False,
        run_dir=str(tmp_path / "run"),
    )
    return {**cfg, **overrides}


def recorded_gaps(run):
    tok = run.tokens(where="in_loss")
    d = (tok.old_logprob.astype(np.float64) - tok.rollout_logprob.astype(np.float64)).fillna(0.0)
    return tok, d.groupby(tok.sample_id).sum()


def test_bf16_sampler_gap_triggers_the_sequence_mask_and_masked_coef_is_zero(tmp_path):
    # bf16 generation against fp32 scoring: gaps of about 1e-4 of either sign; with C_max = 1 every
    # sequence whose summed gap is > 0 leaves the gradient
    run = load_run(
        train(tiny(tmp_path, bf16=True, rollout_correction="sequence_mask", rollout_correction_clip_max=1.0))
    )
    tok, seq = recorded_gaps(run)
    assert tok.rollout_logprob.notna().all() and (tok.old_logprob != tok.rollout_logprob).any()
    clear = seq[(seq.abs() > 1e-6)]  # sums far enough from log C_max = 0 to decide from float32 columns
    dropped = set(clear[clear > 0].index)
    assert dropped and set(clear[clear < 0].index)  # some sequences masked, some kept
    masked = tok[tok.masked]
    assert dropped <= set(masked.sample_id) and set(masked.sample_id) <= set(seq[seq > -1e-6].index)
    assert (masked.coef == 0).all() and (masked.is_weight == 0).all()
    assert (masked.masked_by == "is_sequence_mask").all()
    kept = tok[~tok.masked]
    np.testing.assert_allclose(kept.is_weight, np.exp(seq.loc[kept.sample_id]), rtol=1e-4)
    assert (kept.coef != 0).any() and kept.masked_by.isna().all()
    s = run.steps.iloc[0]
    n_masked = masked.sample_id.nunique()
    assert s.is_masked_sequences == n_masked and s.is_masked_tokens == len(masked)
    assert s.is_weight_min == 0.0 and s.is_weight_max <= 1.0
    d = (tok.old_logprob.astype(np.float64) - tok.rollout_logprob.astype(np.float64)).to_numpy()
    assert s.rollout_mismatch == pytest.approx(np.abs(d).mean(), rel=1e-3)
    assert s.rollout_kl_k3 == pytest.approx((np.exp(d) - d - 1).mean(), rel=1e-2)
    samples = run.samples.set_index("sample_id")
    np.testing.assert_allclose(samples.rollout_seq_log_ratio.loc[seq.index], seq, atol=1e-6)


def test_top_p_gap_truncated_per_token_from_below(tmp_path):
    # top-p renormalises the sampler's distribution over the nucleus: mu > pi on every sampled token, so the
    # per-token weight exp(log pi_old - log mu) < 1, and token_truncate lifts it to C_min
    run = load_run(
        train(
            tiny(tmp_path, top_p=0.9, rollout_correction="token_truncate", rollout_correction_clip_min=0.95)
        )
    )
    tok = run.tokens(where="in_loss")
    d = (tok.old_logprob.astype(np.float64) - tok.rollout_logprob.astype(np.float64)).to_numpy()
    assert (d < 0).all() and (np.exp(d) < 0.95).all()  # about log 0.9: the nucleus holds ~90 % of the mass
    np.testing.assert_allclose(tok.is_weight, np.clip(np.exp(d), 0.95, 3.0), rtol=1e-5)
    assert (tok.is_weight == np.float32(0.95)).all()
    assert not tok.masked.any()  # truncation removes no gradient
    s = run.steps.iloc[0]
    assert s.is_weight_min == pytest.approx(0.95, rel=1e-6) and np.isnan(s.is_masked_tokens)


def test_off_by_default_records_no_weights(tmp_path):
    run = load_run(train(tiny(tmp_path, top_p=0.9)))
    tok = run.tokens()
    assert tok.is_weight.isna().all() and not tok.masked.fillna(False).any()
    s = run.steps.iloc[0]
    assert s.rollout_mismatch > 0.01 and np.isnan(s.is_weight_mean)


@pytest.mark.trl
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_builtin_loss_equals_trls_loss_on_trls_tensors(tmp_path, monkeypatch, mode):
    """TRL's own correction and loss (a stand-in engine, see integrations/trl/test_trl_rollout.py) against the
    built-in trainer's config, weights and loss on the same tensors: the same weights, and the same
    dL/d log pi per token as TRL's loss gave (recorded coef)."""
    pytest.importorskip("trl")
    from test_trl_rollout import noisy_engine_run

    from tokengrad.integrations import trl as tg_trl

    run, inp = noisy_engine_run(tmp_path, monkeypatch, mode, clip_max=1.5)
    order = inp[tg_trl.SAMPLE_KEY].argsort()
    m = inp["completion_mask"][order].float()
    old, rollout = inp["old_per_token_logps"][order], inp["sampling_per_token_logps"][order]
    tok = run.tokens().sort_values(["pass_id", "sample_id", "position"])
    rows = tok[tok.pass_id == 0]
    cfg = make_config({"rollout_correction": mode, "rollout_correction_clip_max": 1.5, "aggregation": "dapo"})
    b = correction.with_weights(
        batch_of(old, rollout, m, inp["advantages"][order]), correction.correction_of(cfg)
    )
    torch.testing.assert_close(b.is_weights, inp["importance_sampling_ratio"][order])
    lp = old.clone()
    lp[m.bool()] = torch.tensor(rows.logprob.to_numpy())  # the log-probs TRL's loss was built from
    lp.requires_grad_()
    out = policy_loss(lp, old, b.advantages, m, aggregation="dapo", is_weight=b.is_weights.expand_as(lp))
    out.loss.backward()
    np.testing.assert_allclose(lp.grad[m.bool()].numpy(), rows.coef.to_numpy(), rtol=1e-4, atol=1e-8)
    if mode.endswith("mask"):
        assert (rows.coef == 0).any() and (lp.grad[b.is_weights.expand_as(lp) == 0] == 0).all()
