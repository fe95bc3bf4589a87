"""Staleness apart from the engine's mismatch (tokengrad.read.rollout_queries MISMATCH / STALENESS, the
version columns tokens.policy_version / trainer_version) and confident disagreement: runs recorded through
st.track with hand-chosen log-probs, where each part is made alone and both together, a run where an fp32
trainer meets a sampler at another temperature and in bf16, and the built-in trainer with num_iterations = 2.

Off-policy gap of a row: log pi_theta - log mu = (log pi_theta - log pi_old) + (log pi_old - log mu)
                                               =        staleness           +        mismatch
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tokengrad import load_run
from tokengrad.doctor.engine import diagnose
from tokengrad.figures.rollout import gap_verdict, make_off_policy_split_figure
from tokengrad.objective import rollout_correction as rc
from tokengrad.read import rollout_queries as rq
from tokengrad.record import Recorder

N, T, V = 2, 3, 8
# per case: (log pi_theta, log pi_old, log mu, policy_version, trainer_version) of every token
CASES = {
    "stale": (-1.2, -1.0, -1.0, 4, 5),  # same engine, one version old: staleness -0.2, mismatch 0
    "mismatch": (-1.0, -1.0, -1.3, 4, 4),  # another engine, same version: staleness 0 (lag 0), mismatch 0.3
    "both": (-0.5, -0.8, -1.0, 3, 5),  # two versions old and another engine: 0.3 + 0.2 = 0.5
}


def _track(st, theta, old, mu, pv, tv, update_id=0):
    lp = torch.full((N, T), theta, requires_grad=True)  # [N, T]
    st.track(
        lp,
        token_ids=torch.zeros(N, T, dtype=torch.long),
        old_logprobs=torch.full((N, T), old),
        rollout_logprobs=torch.full((N, T), mu),
        advantages=torch.tensor([1.0, -1.0]),
        sample_ids=torch.arange(N),
        policy_versions=pv,
        trainer_version=tv,
        update_id=update_id,
    )
    st.backward(lp.sum())


@pytest.fixture
def split_run(tmp_path):
    """Steps 0, 1, 2: the cases in CASES order, each step one pass."""
    with Recorder(tmp_path / "split") as rec:
        for step, case in enumerate(CASES.values()):
            with rec.step(step) as st:
                _track(st, *case)
    return load_run(tmp_path / "split")


def test_versions_recorded_per_row(split_run):
    df = split_run.tokens(columns=["step", "policy_version", "trainer_version"])
    got = df.groupby("step")[["policy_version", "trainer_version"]].agg(["min", "max"]).to_numpy()
    assert got.tolist() == [[4, 4, 5, 5], [4, 4, 4, 4], [3, 3, 5, 5]]
    assert str(df["policy_version"].dtype).lower() == "int64"


def test_each_part_alone_and_both(split_run):
    s = rq.off_policy_split(split_run).set_index("step")
    # step 0: staleness |-1.2 - -1.0| = 0.2, mismatch |-1.0 - -1.0| = 0
    assert s.loc[0, "mismatch_abs_mean"] == 0 and s.loc[0, "staleness_abs_mean"] == pytest.approx(
        0.2, abs=1e-6
    )
    assert s.loc[0, "n_stale"] == N * T and s.loc[0, "lag_max"] == 1
    # step 1: lag 0, so no stale rows (staleness null); mismatch |-1.0 - -1.3| = 0.3
    assert s.loc[1, "n_stale"] == 0 and np.isnan(s.loc[1, "staleness_abs_mean"])
    assert s.loc[1, "mismatch_abs_mean"] == pytest.approx(0.3, abs=1e-6)
    # step 2: staleness |-0.5 - -0.8| = 0.3, mismatch |-0.8 - -1.0| = 0.2, lag 2; their sum is the gap
    # log pi_theta - log mu = -0.5 - -1.0 = 0.5
    assert s.loc[2, "staleness_abs_mean"] == pytest.approx(0.3, abs=1e-6)
    assert s.loc[2, "mismatch_abs_mean"] == pytest.approx(0.2, abs=1e-6) and s.loc[2, "lag_max"] == 2
    t = split_run.sql(f"SELECT {rq.STALENESS} + {rq.MISMATCH} AS total FROM tokens WHERE step = 2")
    np.testing.assert_allclose(t["total"], 0.5, atol=1e-6)
    assert rq.has_staleness(split_run)


def test_summary_and_verdict(split_run):
    s = rq.gap_summary(split_run)
    # distinct scored tokens: 6 per step; mean |d| = (0 + 0.3 + 0.2) / 3; NeMo-RL mean exp(|d|)
    assert s["n_scored"] == 18 and s["mismatch_abs_mean"] == pytest.approx(0.5 / 3, abs=1e-6)
    assert s["token_mult_prob_error"] == pytest.approx((1 + math.exp(0.3) + math.exp(0.2)) / 3, abs=1e-6)
    assert s["n_stale"] == 12 and s["staleness_abs_mean"] == pytest.approx(0.25, abs=1e-6)
    line = gap_verdict(s)
    assert "critical" in line and "Staleness" in line and "up to 2 versions" in line
    fig = make_off_policy_split_figure(rq.off_policy_split(split_run))
    assert [len(tr.x) for tr in fig.data] == [3, 2]  # staleness only where a step has stale rows


def test_an_fp32_sampler_reads_healthy(tmp_path):
    """A gap of 1e-7 nats is rounding: the verdict says healthy, not a signal."""
    with Recorder(tmp_path / "fp32") as rec:
        with rec.step(0) as st:
            _track(st, -1.0, -1.0, -1.0 + 1e-7, 0, 0)
    s = rq.gap_summary(load_run(tmp_path / "fp32"))
    assert s["mismatch_abs_mean"] < 1e-6 and rq.mismatch_level(s["mismatch_abs_mean"]) == "healthy"
    line = gap_verdict(s)
    assert ": healthy (below 0.01 nats" in line and "fine" in line and "Staleness" not in line


def test_read_side_thresholds_are_the_doctors():
    from tokengrad.doctor import detect_mismatch as dm

    assert (rq.MISMATCH_WARNING, rq.MISMATCH_CRITICAL) == (dm.MISMATCH_WARNING, dm.MISMATCH_CRITICAL)


def test_doctor_reports_mismatch_apart_from_staleness(tmp_path):
    """Six steps of the 'both' case: rollout_mismatch fires on the 0.2-nat mismatch and says the 0.3-nat
    staleness is apart from it."""
    with Recorder(tmp_path / "both") as rec:
        for step in range(6):
            with rec.step(step) as st:
                theta, old, mu, pv, tv = CASES["both"]
                _track(st, theta, old, mu, pv + step, tv + step)
                metrics = rc.gap_metrics(torch.full((N, T), old), torch.full((N, T), mu), torch.ones(N, T))
                st.log(**metrics)
    f = next(f for f in diagnose(tmp_path / "both") if f.id == "rollout_mismatch")
    assert f.severity == "critical"  # 0.2 >= 0.1
    assert "engine mismatch is 0.2 nats, apart from the staleness of 36 rows up to 2 versions" in f.message
    assert f.evidence["values"]["staleness_abs_mean"] == pytest.approx(0.3, abs=1e-6)


# ---- an fp32 trainer against a sampler at T = 0.1 in bf16 -------------------------------------------------
DELTA, WIDE = 1.5, 128  # the top token's logit above the 127 others (bf16 holds 1.5 and 0 exactly)
P_TRAINER = math.exp(1.5) / (math.exp(1.5) + 127)  # 4.4817 / 131.4817 = 0.034086 at T = 1
P_ENGINE = math.exp(15) / (math.exp(15) + 127)  # logits / 0.1: 1 - 127 e^-15 = 0.999961


def _engine_run(path):
    """Sequences 0, 1: the engine samples at T = 0.1 from bf16 logits while the trainer scores them at
    T = 1 in fp32. Sequences 2, 3: the engine at the trainer's temperature (bf16 rounding only). 4 steps."""
    logits = torch.zeros(4, T, WIDE)
    logits[..., 0] = DELTA  # [4, T, V]
    ids = torch.zeros(4, T, dtype=torch.long)  # the top token: what a T = 0.1 sampler draws
    trainer = torch.log_softmax(logits, -1)[..., 0]  # [4, T] fp32, T = 1
    engine_t = torch.tensor([0.1, 0.1, 1.0, 1.0])[:, None, None]  # [4, 1, 1]
    engine = torch.log_softmax(logits.bfloat16().float() / engine_t, -1)[..., 0]  # [4, T]
    with Recorder(path) as rec:
        for step in range(4):
            with rec.step(step) as st:
                lp = trainer.clone().requires_grad_(True)
                st.track(
                    lp,
                    token_ids=ids,
                    old_logprobs=trainer,
                    rollout_logprobs=engine,
                    advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
                    sample_ids=torch.arange(4),
                    policy_versions=step,
                    trainer_version=step,
                )
                st.backward(lp.sum())
    return load_run(path)


def test_confident_disagreement_rows(tmp_path):
    hits = rq.confident_disagreements(_engine_run(tmp_path / "temp"))
    assert len(hits) == 2 * T * 4  # every token of sequences 0 and 1, each step; none of 2 and 3
    assert set(hits["sample_id"]) == {0, 1}
    np.testing.assert_allclose(hits["trainer_prob"], P_TRAINER, rtol=1e-5)
    np.testing.assert_allclose(hits["engine_prob"], P_ENGINE, rtol=1e-5)
    # the reverse direction is found too: swap which side is confident
    with pytest.raises(ValueError, match="0 < lo < hi < 1"):
        rq.confident_disagreements(load_run(tmp_path / "temp"), hi=0.1, lo=0.9)


def test_confident_disagreement_finding(tmp_path):
    _engine_run(tmp_path / "temp")
    f = next(f for f in diagnose(tmp_path / "temp") if f.id == "confident_disagreement")
    assert f.severity == "critical" and f.first_step == 0 and f.last_step == 3  # 24 of 48 tokens: 50 %
    assert "24 of 48 scored loss tokens (50 %)" in f.message
    row = f.evidence["values"]["tokens"][0]
    assert row["sample_id"] in (0, 1) and row["position"] in range(T) and row["token_id"] == 0
    assert row["trainer_prob"] == pytest.approx(P_TRAINER, rel=1e-5)
    assert row["engine_prob"] == pytest.approx(P_ENGINE, rel=1e-5)
    assert len(f.tokens) == 5 and f.tokens[0].prob == pytest.approx(P_TRAINER, rel=1e-5)


def test_no_confident_disagreement_on_rounding(split_run, tmp_path):
    assert rq.confident_disagreements(split_run).empty  # |d| <= 0.3: p never crosses from < 0.1 to > 0.9
    assert not [f for f in diagnose(split_run.path) if f.id == "confident_disagreement"]


# ---- the built-in trainer ------------------------------------------------------------------------------
@pytest.mark.slow
def test_trainer_records_versions_and_splits_the_gap(tmp_path):
    """num_iterations = 2 and a top-p 0.8 sampler: each step samples at the version before its first
    update, its update k scores at that version + k; staleness is exactly 0 on update 0, and the mismatch
    (log of the nucleus mass the sampler renormalised by, <= 0) is the same on both updates."""
    from letters_task import LettersTask  # noqa: F401  (registers the "letters" task)

    from tokengrad.train.trainer import train

    run = load_run(
        train(
            dict(
                model="tiny",
                task="letters",
                task_params={"noisy": True},
                steps=2,
                prompts_per_step=2,
                group_size=4,
                max_new_tokens=6,
                lr=1e-2,
                top_p=0.8,
                num_iterations=2,
                progress=False,
                checkpoint=False,
                run_dir=str(tmp_path / "tiny"),
            )
        )
    )
    cols = ["step", "update_id", "sample_id", "position", "policy_version", "trainer_version", "logprob"]
    df = run.tokens(columns=cols + ["old_logprob", "rollout_logprob", "in_loss"])
    assert (df["policy_version"] == 2 * df["step"]).all()  # two updates per step before it
    assert (df["trainer_version"] == df["policy_version"] + df["update_id"]).all()
    first = df[df["update_id"] == 0]
    assert (first["logprob"] == first["old_logprob"]).all()  # staleness exactly 0 at lag 0
    s = rq.off_policy_split(run).set_index("step")
    assert (s["lag_max"] == 1).all() and (s["staleness_abs_mean"] > 0).all()
    d = (df["old_logprob"] - df["rollout_logprob"]).dropna()
    assert (d <= 1e-6).all() and d.min() < -1e-3  # top-p: the engine gives the kept tokens more mass
    assert rq.has_staleness(run)
