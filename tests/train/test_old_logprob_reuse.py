"""log pi_old from the loss pass itself (config `reuse_old_logprobs`, updates.reuses_old_logprobs): when a
step is one on-policy update the trainer skips the no-grad scoring pass, and the run it records is the one
the scoring pass gives; everywhere else pi_old keeps its own pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from letters_task import LettersTask  # noqa: F401  (registers the "letters" task)
from test_training_math import tiny as tiny_config

from tokengrad import load_run
from tokengrad.train.config import describe_config, make_config
from tokengrad.train.correction import correction_of
from tokengrad.train.settings import schedule_of, weighting_of
from tokengrad.train.trainer import Trainer, train
from tokengrad.train.updates import GRPOUpdate, reuses_old_logprobs

TOKEN_COLUMNS = ["logprob", "old_logprob", "ref_logprob", "ratio", "coef", "weight"]
STEP_COLUMNS = ["loss", "grad_norm", "kl", "rollout_mismatch", "rollout_mismatch_max", "rollout_kl_k3"]
SAMPLE_COLUMNS = ["rollout_seq_log_ratio", "rollout_gap_mean"]


def tiny(tmp_path, name: str, **overrides) -> dict:
    """Two steps of 2 prompts x G=4, 8 new tokens, on the tiny model in fp32."""
    return tiny_config(tmp_path, name, **{"steps": 2, **overrides})


def reuses(**overrides) -> bool:
    cfg = make_config(overrides)
    return reuses_old_logprobs(
        cfg.reuse_old_logprobs, schedule_of(cfg), weighting_of(cfg), correction_of(cfg)
    )


@pytest.fixture
def scored(monkeypatch):
    """Per Trainer.score call: whether the batch it returned already held log pi_old (a scoring pass ran)."""
    seen = []
    score = Trainer.score

    def spy(self, g):
        b = score(self, g)
        seen.append(b is not None and bool(torch.isfinite(b.old_logprobs).all()))
        return b

    monkeypatch.setattr(Trainer, "score", spy)
    return seen


def test_the_config_key_is_documented_and_on_by_default():
    assert make_config({}).reuse_old_logprobs is True
    assert "  reuse_old_logprobs = True\n" in describe_config()


@pytest.mark.parametrize(
    "settings",
    [
        # two micro-batches, and log-probs of softmax(z / T) at the sampling temperature
        dict(weighting="grpo", grad_accum=2, temperature=0.7),
        dict(weighting="ar", beta=0.05, bucket_every=1),  # the rule reads p_old; pi_ref keeps its pass
        dict(weighting="tr_grpo", aggregation="dapo"),
    ],
    ids=["grpo_accum_T0.7", "ar_beta_buckets", "tr_grpo_dapo"],
)
def test_reuse_records_what_the_scoring_pass_records(tmp_path, scored, settings):
    assert reuses(**settings)
    runs = {
        reuse: load_run(train(tiny(tmp_path, f"reuse_{reuse}", reuse_old_logprobs=reuse, **settings)))
        for reuse in (True, False)
    }
    assert scored == [False, False, True, True]  # with reuse pi_old is only known in the loss pass
    keys = ["step", "update_id", "sample_id", "position"]
    a, b = (r.tokens().sort_values(keys).reset_index(drop=True) for r in (runs[True], runs[False]))
    assert len(a) == len(b) > 0 and a[keys].equals(b[keys])
    for col in TOKEN_COLUMNS:
        np.testing.assert_allclose(
            a[col].astype(float), b[col].astype(float), rtol=1e-5, atol=1e-7, err_msg=col
        )
    on = a[a.in_loss]
    assert on.old_logprob.notna().all() and (on.ratio == 1.0).all()  # the one pass is on-policy
    assert (on.coef != 0).any()  # a real gradient, or the comparison tests little
    for col in STEP_COLUMNS:
        if col in runs[False].steps:
            got, want = (r.steps.sort_values("step")[col].astype(float) for r in (runs[True], runs[False]))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=col)
    for col in SAMPLE_COLUMNS:
        got, want = (r.samples.sort_values(["step", "sample_id"])[col].astype(float) for r in runs.values())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=col)
    if settings.get("bucket_every"):  # the probability change per pi_old bucket, from the tracked pi_old
        keys = ["step", "update_id", "bucket"]
        got, want = (r.buckets.sort_values(keys).reset_index(drop=True) for r in runs.values())
        assert got[keys].equals(want[keys]) and got.dprob_mean.notna().any()
        num = [c for c in got.columns if got[c].dtype.kind == "f"]
        np.testing.assert_allclose(got[num], want[num], rtol=1e-5, atol=1e-7)


def test_reuse_takes_the_scoring_pass_out_of_time_score(tmp_path, monkeypatch):
    calls = []
    score_rows = GRPOUpdate.score_rows
    monkeypatch.setattr(
        GRPOUpdate, "score_rows", lambda self, *a, **k: calls.append(1) or score_rows(self, *a, **k)
    )
    times = {}
    for reuse in (True, False):
        calls.clear()
        run = load_run(train(tiny(tmp_path, f"reuse_{reuse}", steps=3, reuse_old_logprobs=reuse)))
        times[reuse] = run.steps["time_score"].to_numpy()
        assert len(calls) == (0 if reuse else 3)  # one scoring pass per step, or none
    # what is left of time_score is the rows' selection: no forward (a few ms at most on a loaded machine)
    assert times[True].sum() < times[False].sum() and times[True].max() < 0.05, times


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_iterations=2),  # the second epoch runs after an optimizer step
        dict(mini_batches=2),  # the second mini-batch runs after an optimizer step
        dict(rollout_correction="token_truncate"),  # its IS weights need log pi_old before the loss
    ],
    ids=["num_iterations_2", "mini_batches_2", "rollout_correction"],
)
def test_no_reuse_where_pi_old_is_needed_before_or_after_an_update(tmp_path, scored, settings):
    assert not reuses(**settings)
    run = load_run(train(tiny(tmp_path, "run", steps=1, **settings)))
    assert scored == [True]  # pi_old had its own pass before the loss
    first = run.tokens(where="in_loss AND update_id = 0")
    assert (first.ratio == 1.0).all()  # ... which the first update's loss pass equals bitwise
    if "num_iterations" in settings or "mini_batches" in settings:
        assert run.steps["n_updates"].tolist() == [2]
    else:
        assert run.tokens(where="in_loss")["is_weight"].notna().all()
        assert math.isfinite(run.steps["is_weight_mean"].iloc[0])


def test_no_reuse_for_phases_batch_statistics_or_when_switched_off():
    assert reuses() and reuses(weighting="tr_grpo", weighting_params={"placement": "ratio"}, beta=0.1)
    assert not reuses(weighting="lopti")  # phases from p_old before the first pass
    assert not reuses(weighting="ar_lopti")
    assert not reuses(weighting="cw_grpo")  # batch statistics over the update's rows
    assert not reuses(weighting="kl_cov")
    assert not reuses(reuse_old_logprobs=False)
