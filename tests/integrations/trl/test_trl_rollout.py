"""The rollout engine's log-probs inside TRL's real code: TRL 1.16 applies its importance-sampling correction
only with `use_vllm`, and vLLM does not install here, so a stand-in engine replaces exactly two things: the
`VLLMGeneration` object (its weight sync is a no-op) and generation itself, through TRL's documented
`rollout_func` hook, which samples from the policy and returns log-probs of a perturbed distribution mu.
Everything else (TRL's old log-probs, its ratio, truncation and masks, its loss and its sampling/* metrics)
is TRL's own code."""

import math

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.integrations import trl as tg_trl  # noqa: E402
from tokengrad.objective import rollout_correction as rc  # noqa: E402

pytestmark = pytest.mark.trl


class StandInEngine:
    """What TRL keeps of its vLLM backend when a rollout_func generates: weight sync (a no-op here)."""

    def __init__(self, **kwargs):
        self.synced = 0

    def sync_weights(self):
        self.synced += 1


def policy_logps(trainer, prompt, completion):
    """log pi of `completion` after `prompt` at TRL's temperature, as TRL scores it (fp32, no padding)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = trainer.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / trainer.temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0], logits


def make_rollout_func(engine_logps, length):
    """rollout_func(prompts, trainer): sample `length` tokens from the policy (no EOS), return the engine's
    log-probs `engine_logps(index, logp_policy [T], logits [T, V], completion)` for them."""

    def rollout_func(prompts, trainer):
        tok = trainer.processing_class
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for i, prompt in enumerate(prompts):
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                gen = trainer.model.generate(
                    torch.tensor([p]),
                    do_sample=True,
                    max_new_tokens=length,
                    min_new_tokens=length,
                    temperature=trainer.temperature,
                    top_k=0,
                    pad_token_id=tok.pad_token_id,
                )
            c = gen[0, len(p) :].tolist()
            lp, logits = policy_logps(trainer, p, c)
            out["prompt_ids"].append(p)
            out["completion_ids"].append(c)
            out["logprobs"].append(engine_logps(i, lp, logits, c).tolist())
        return out

    return rollout_func


def stand_in_trainer(tmp_path, monkeypatch, engine_logps, length=8, **overrides):
    monkeypatch.setattr(trl.trainer.grpo_trainer, "VLLMGeneration", StandInEngine)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    cfg = dict(use_vllm=True, max_completion_length=length, max_steps=1)
    cfg.update(overrides)
    trainer = make_trainer(tmp_path, **cfg)
    trainer.rollout_func = make_rollout_func(engine_logps, length)
    return trainer


def captured_inputs(trainer):
    """TRL's compute_loss inputs, per micro-batch (outside the recording)."""
    seen = []
    inner = trainer.compute_loss

    def compute_loss(model, inputs, *a, **k):
        if torch.is_grad_enabled() and model.training:
            seen.append({k: v for k, v in inputs.items() if torch.is_tensor(v)})
        return inner(model, inputs, *a, **k)

    trainer.compute_loss = compute_loss
    return seen


def per_sample_gap(gaps):
    """Engine log-probs log mu = log pi - gaps[i % len(gaps)] for sample i: a constant gap d per token."""
    return lambda i, lp, logits, c: lp - gaps[i % len(gaps)]


def test_trl_4772_arithmetic_sequence_mask_removes_the_sequence(tmp_path, monkeypatch):
    # a per-token gap of 0.012 over 100 tokens: TRL sums it to 1.2, ratio exp(1.2) = 3.32 > 3.0 (the cap);
    # a gap of 0.005 sums to 0.5, ratio 1.65, kept
    trainer = stand_in_trainer(tmp_path, monkeypatch, per_sample_gap([0.012, 0.005]), length=100)
    assert trainer.vllm_importance_sampling_mode == "sequence_mask"  # TRL 1.16's default
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    run = load_run(tmp_path / "run")
    tok, samples = run.tokens(), run.samples.set_index("sample_id")
    assert samples.length.tolist() == [100] * 4
    gap = (tok.old_logprob - tok.rollout_logprob).groupby(tok.sample_id)
    np.testing.assert_allclose(gap.mean(), [0.012, 0.005, 0.012, 0.005], atol=2e-5)
    # the sequence ratio as TRL 1.16 computes it (the sum of the gaps) and the mean gap beside it
    np.testing.assert_allclose(samples.rollout_seq_log_ratio, [1.2, 0.5, 1.2, 0.5], atol=2e-3)
    np.testing.assert_allclose(samples.rollout_gap_mean, [0.012, 0.005, 0.012, 0.005], atol=2e-5)
    dropped = tok.sample_id % 2 == 0
    assert (tok[dropped].is_weight == 0).all() and (tok[dropped].coef == 0).all()
    assert (tok[dropped].masked_by == "is_sequence_mask").all() and tok[dropped].masked.all()
    np.testing.assert_allclose(tok[~dropped].is_weight, math.exp(0.5), rtol=2e-3)
    assert tok[~dropped].masked_by.isna().all() and (tok[~dropped].coef != 0).all()
    steps = run.steps.iloc[0]
    assert steps.is_masked_sequences == 2 and steps.is_masked_tokens == 200
    assert steps.is_weight_min == 0.0 and steps.is_weight_max == pytest.approx(math.exp(0.5), rel=2e-3)


def noisy_engine_run(tmp_path, monkeypatch, mode: str, clip_max: float = 1.5):
    """One recorded TRL step whose engine log-probs are log pi + 0.8 N(0, 1) per token, in IS mode `mode`;
    returns the run and TRL's compute_loss inputs of its first micro-batch."""
    g = torch.Generator().manual_seed(0)
    noise = lambda i, lp, logits, c: lp + 0.8 * torch.randn(lp.shape, generator=g)  # noqa: E731
    trainer = stand_in_trainer(
        tmp_path,
        monkeypatch,
        noise,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_max=clip_max,
    )
    seen = captured_inputs(trainer)
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    return load_run(tmp_path / "run"), seen[0]


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_every_is_mode_records_trls_own_weights_and_metrics(tmp_path, monkeypatch, mode):
    run, inputs = noisy_engine_run(tmp_path, monkeypatch, mode)
    tok = run.tokens().sort_values(["pass_id", "sample_id", "position"])
    m = inputs["completion_mask"].bool()
    sid = inputs[tg_trl.SAMPLE_KEY]
    order = sid.argsort()
    # per token: TRL's own sampler log-probs and the weight its loss applied
    rows = tok[tok.pass_id == 0]
    np.testing.assert_allclose(
        rows.rollout_logprob, inputs["sampling_per_token_logps"][order][m[order]], rtol=1e-6
    )
    applied = inputs["importance_sampling_ratio"].expand_as(m)[order][m[order]]
    np.testing.assert_allclose(rows.is_weight, applied, rtol=1e-6)
    # the same correction from the shared module equals TRL's on the same tensors
    corr = rc.RolloutCorrection(mode, clip_max=1.5)
    mine = rc.correction_weights(inputs["old_per_token_logps"], inputs["sampling_per_token_logps"], m, corr)
    torch.testing.assert_close(mine, inputs["importance_sampling_ratio"])
    if mode.endswith("mask"):
        assert ((rows.is_weight == 0) == rows.masked).all() and rows.masked.any()
        assert (rows[rows.masked].coef == 0).all()
    else:
        assert not rows.masked.any() and rows.is_weight.max() <= 1.5
    # per step: equal to TRL's own logged sampling/* metrics
    s = run.steps.iloc[0]
    for mine, trls in [
        ("rollout_mismatch", "sampling_sampling_logp_difference_mean"),
        ("rollout_mismatch_max", "sampling_sampling_logp_difference_max"),
        ("is_weight_min", "sampling_importance_sampling_ratio_min"),
        ("is_weight_mean", "sampling_importance_sampling_ratio_mean"),
        ("is_weight_max", "sampling_importance_sampling_ratio_max"),
    ]:
        assert s[mine] == pytest.approx(s[f"trl_{trls}"], rel=1e-5), mine
    d = (rows.old_logprob - rows.rollout_logprob).to_numpy(np.float64)
    assert s.rollout_kl_k1 == pytest.approx((-d).mean(), rel=1e-4)
    assert s.rollout_kl_k3 == pytest.approx((np.exp(d) - d - 1).mean(), rel=1e-4)
    assert s.rollout_mismatch_p99 == pytest.approx(np.quantile(np.abs(d), 0.99), rel=1e-4)


def test_nan_from_the_engine_is_recorded_null_and_counted(tmp_path, monkeypatch):
    def some_nan(i, lp, logits, c):
        out = lp - 0.01
        out[::3] = float("nan")  # vLLM returns NaN once entropy collapses (TRL #6166)
        return out

    trainer = stand_in_trainer(
        tmp_path, monkeypatch, some_nan, vllm_importance_sampling_mode="token_truncate"
    )
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    run = load_run(tmp_path / "run")
    tok = run.tokens()
    nan = tok.position % 3 == 0
    assert tok[nan].rollout_logprob.isna().all() and tok[~nan].rollout_logprob.notna().all()
    assert run.steps.n_rollout_nan.item() == int(nan.sum()) and run.steps.n_nonfinite.item() == 0
    assert (tok[nan].is_weight == 1.0).all()  # TRL's weight for an unscored token: no correction
    assert run.steps.rollout_mismatch.item() == pytest.approx(0.01, abs=1e-5)


def test_top_k_renormalised_sampler_gap_is_log_of_the_kept_mass(tmp_path, monkeypatch):
    k, log_kept = 5, {}

    def top_k(i, lp, logits, c):
        p = logits.softmax(-1)  # [T, V]
        log_s = p.topk(k, -1).values.sum(-1).log()  # log S, S the kept mass
        log_kept[tuple(c)] = log_s
        ranks = (p > p.gather(-1, torch.tensor(c)[:, None])).sum(-1)
        # mu = p / S on kept tokens; a token outside the top k cannot be drawn by this sampler: scored NaN
        return torch.where(ranks < k, lp - log_s, torch.tensor(float("nan")))

    trainer = stand_in_trainer(
        tmp_path, monkeypatch, top_k, vllm_importance_sampling_mode="token_truncate", temperature=0.5
    )
    tg_trl.attach(trainer, tmp_path / "run")
    trainer.train()
    tok = load_run(tmp_path / "run").tokens()
    assert tok.rollout_logprob.notna().sum() > 0
    for _, rows in tok.groupby("sample_id"):
        rows = rows.sort_values("position")
        log_s = log_kept[tuple(rows.token_id.tolist())]  # the mass the sampler kept, at generation time
        kept = rows.rollout_logprob.notna().to_numpy()
        # for a kept token, log pi_old - log mu = log S
        np.testing.assert_allclose(
            (rows.old_logprob - rows.rollout_logprob)[kept], log_s.numpy()[kept], atol=1e-5
        )
