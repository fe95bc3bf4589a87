"""A detector that returns no finding has looked: where the data it reads is missing it raises NotChecked
naming what is missing, and on a run that has the data and is healthy it returns [] without NotChecked.

Each case edits doctor_runs' healthy run (every detector silent on it) so that one kind of data is gone,
and checks the detector's reason word for word; the healthy run with a mask record is the counter-case.
"""

from __future__ import annotations

import numpy as np
import pytest
from doctor_runs import tokens_of, write_doctor_run

from tokengrad.doctor.engine import examine


def _masked(t):
    """The healthy run with a mask record: no token masked (the TRL attach writes masked = False)."""
    t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0)).assign(masked=False, masked_by=None)


def _no_grad_norm(t):
    t["steps"]["grad_norm"] = np.nan


def _no_buckets(t):
    t["buckets"] = t["buckets"].iloc[0:0]


def _no_rollout(t):
    t["steps"]["rollout_mismatch"] = np.nan
    t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0)).assign(rollout_logprob=np.nan)


def _no_coef(t):
    t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0)).assign(coef=np.nan)


def _one_logprob(t):
    t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0)).assign(
        old_logprob=np.nan, rollout_logprob=np.nan
    )


def _short_completions(t):
    t["samples"]["completion"] = "w1 w2 w3"


def _no_correct(t):
    t["samples"] = t["samples"].drop(columns=["correct"])


def _singleton_groups(t):
    t["samples"]["group_id"] = t["samples"]["sample_id"]


def _no_time(t):
    t["steps"] = t["steps"].drop(columns=["time_step"])


def _budgeted(t):
    t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0)).assign(selected_by="sequence")


CASES = [  # (edit, run length, detector, the reason it gives)
    (_no_grad_norm, 60, "gradient_spike", "the run records no gradient norm (grad_norm)"),
    (None, 8, "grad_norm_drift", "8 steps have a gradient, the trend needs 10"),
    (_no_time, 60, "throughput_decay", "the run records no step time (time_step)"),
    (None, 8, "throughput_decay", "8 steps record their time, the trend needs 11 (the first left out)"),
    (None, 8, "gradient_spike", "8 steps have a gradient, the robust z needs 10"),
    (
        _no_buckets,
        60,
        "low_prob_dominance",
        "the run has no bucket-analysis steps (buckets table; bucket_every)",
    ),
    (_no_buckets, 60, "high_prob_drag", "the run has no bucket-analysis steps (buckets table; bucket_every)"),
    (
        None,
        10,  # bucket steps 0 and 5
        "high_prob_drag",
        "2 bucket-analysis step(s) record the p >= 0.75 correct_ratio, the sign test needs 3",
    ),
    (_no_coef, 60, "zeroed_gradients", "no token row records coef"),
    (_no_rollout, 60, "rollout_mismatch", "the run records no rollout log-probs (steps.rollout_mismatch)"),
    (None, 4, "rollout_mismatch", "4 steps record rollout_mismatch, the trend needs 5"),
    (_no_rollout, 60, "confident_disagreement", "no loss token has both a rollout and a trainer log-prob"),
    (
        None,
        60,
        "masked_sequences",
        "the run records no sequence mask (tokens.masked, or steps.is_masked_sequences with samples)",
    ),
    (
        _one_logprob,
        60,
        "logprob_constant",
        "the token rows record one log-prob column (logprob); the check compares two",
    ),
    (_short_completions, 60, "repetition", "every completion is under 8 words, seq-rep-3's least"),
    (_no_correct, 60, "format_gaming", "no sample records correct"),
    (None, 8, "length_hacking", "8 steps record samples, the trend needs 10"),
    (None, 8, "reward_constant", "8 steps record rewards, the check needs 10"),
    (_singleton_groups, 60, "advantage_collapse", "no group holds two scored completions (samples.group_id)"),
    (_singleton_groups, 60, "degenerate_groups", "no group holds two completions (samples.group_id)"),
    (
        _budgeted,
        60,
        "token_count_mismatch",
        "every step kept a token budget: its rows are not the whole loss mask",
    ),
]


@pytest.mark.parametrize(
    ("edit", "n_steps", "name", "reason"), CASES, ids=lambda c: getattr(c, "__name__", c)
)
def test_missing_data_is_named_not_passed_as_healthy(tmp_path, edit, n_steps, name, reason):
    run = write_doctor_run(tmp_path / "r", n_steps=n_steps, edit=edit)
    result = examine(run, only=[name])
    assert result.findings == []
    assert [(n.detector, n.reason) for n in result.not_checked] == [(name, reason)]


def test_a_healthy_run_with_the_data_gives_no_finding_and_no_not_checked(tmp_path):
    """The detectors above on the run that has what each reads: [] and no NotChecked."""
    run = write_doctor_run(tmp_path / "ok", edit=_masked)
    names = sorted({c[2] for c in CASES})
    result = examine(run, only=names)
    assert result.findings == []
    assert result.not_checked == []


def test_truncation_from_token_rows_when_the_run_has_no_samples(tmp_path):
    """A run with token rows and no samples table (the verl plugin's): the completions' lengths come from
    their token rows, so truncation is checked; every completion at the limit is truncated (critical)."""

    def at_limit(t):
        t["samples"]["length"] = 64  # doctor_runs.MAX_NEW_TOKENS
        t["samples"]["truncated"] = True  # no end token on the last row
        t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0))
        t["samples"] = t["samples"].iloc[0:0]

    run = write_doctor_run(tmp_path / "t", n_steps=12, edit=at_limit)
    result = examine(run, only=["truncation"])
    assert [(f.id, f.severity) for f in result.findings] == [("truncation", "critical")]
    assert result.findings[0].evidence["values"]["exact"] is False  # no completion ended early: no end token

    def ended(t):  # 15-25 tokens each, the last one EOS
        t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0))
        t["samples"] = t["samples"].iloc[0:0]

    run = write_doctor_run(tmp_path / "ok", n_steps=12, edit=ended)
    result = examine(run, only=["truncation"])
    assert result.findings == [] and result.not_checked == []


def test_truncation_without_samples_and_with_a_budget_says_why(tmp_path):
    def budgeted(t):
        t["tokens"] = tokens_of(t["samples"], np.random.default_rng(0))
        t["samples"] = t["samples"].iloc[0:0]

    run = write_doctor_run(tmp_path / "b", n_steps=12, edit=budgeted, meta={"token_budget": 100})
    result = examine(run, only=["truncation"])
    assert [n.reason for n in result.not_checked] == [
        "the run records no completion lengths (samples table), and its token rows are budgeted"
    ]
