"""Integrity detectors: runs recorded with the real Recorder, each with one defect of the per-token data
injected, get the finding with its id, severity and the steps/samples behind it; the clean run and every
shipped sample run get none."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokengrad.doctor.engine import examine
from tokengrad.record import Recorder

INTEGRITY = (
    "logprob_constant",
    "rollout_logprob_gap",
    "is_weight_zeroed",
    "reward_nonfinite",
    "reward_constant",
    "token_count_mismatch",
)


def _record(path: Path, defect: str = "", steps: int = 12) -> Path:
    """4 completions of 16 tokens per step (2 groups); `defect` changes one thing from step 5 on."""
    gen = torch.Generator().manual_seed(0)
    with Recorder(path) as rec:
        for step in range(steps):
            bad = step >= 5
            logits = torch.randn(4, 16, 32, generator=gen, requires_grad=True)
            ids = torch.randint(0, 32, (4, 16), generator=gen)
            with rec.step(step) as st:
                lp = torch.log_softmax(logits, -1).gather(2, ids[..., None]).squeeze(-1)
                old, roll = lp.detach().clone(), lp.detach() + 0.01
                isw = torch.ones(4, 16)
                if bad and defect == "old_constant":
                    old[2] = -2.0  # one sequence's pi_old filled with one number
                if bad and defect == "rollout_zero":
                    roll[1] = 0.0  # the engine's log-probs padded with 0.0
                if bad and defect == "is_zero":
                    isw[3] = 0.0  # a sequence's IS weights truncated to 0, no mask
                st.track(
                    lp,
                    token_ids=ids,
                    old_logprobs=old,
                    rollout_logprobs=roll,
                    is_weights=isw,
                    advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
                    sample_ids=torch.arange(4),
                    group_ids=torch.tensor([0, 0, 1, 1]),
                )
                st.backward(-(lp * isw).mean())
                rewards = [1.0, 0.0, 1.0, 0.0]
                if bad and defect == "reward_nan":
                    rewards[2] = float("nan")
                if bad and defect == "reward_none":
                    rewards[0] = None
                if defect == "reward_constant":
                    rewards = [0.0] * 4
                st.samples(sample_ids=[0, 1, 2, 3], group_ids=[0, 0, 1, 1], rewards=rewards)
                st.log(loss=0.1)
    return path


def _found(run: Path) -> dict:
    return {f.id: f for f in examine(run, only=list(INTEGRITY)).findings}


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("integrity") / "clean")


def test_the_clean_run_has_no_integrity_finding_and_every_detector_checked(clean):
    result = examine(clean, only=list(INTEGRITY))
    assert result.findings == [] and result.not_checked == []


def test_a_constant_old_logprob_sequence(tmp_path):
    f = _found(_record(tmp_path / "r", "old_constant"))["logprob_constant"]
    assert f.severity == "warning" and (f.first_step, f.last_step) == (5, 11)
    assert f.evidence["values"]["column"] == "old_logprob" and f.evidence["values"]["sequences"] == 7
    assert f.evidence["values"]["constant_values"] == [-2.0]
    assert [(t.step, t.sample_id) for t in f.tokens] == [(s, 2) for s in range(5, 12)]


def test_rollout_logprobs_padded_with_zero_are_fake_gaps(tmp_path):
    found = _found(_record(tmp_path / "r", "rollout_zero"))
    f = found["rollout_logprob_gap"]
    # sample 1 is a quarter of each step's loss tokens: above the 10 % critical share
    assert f.severity == "critical" and (f.first_step, f.last_step) == (5, 11)
    assert f.evidence["values"]["steps"] == list(range(5, 12))
    assert {t.sample_id for t in f.tokens} == {1} and f.tokens[0].step == 5
    assert found["logprob_constant"].evidence["values"]["column"] == "rollout_logprob"


def test_is_weights_zeroed_on_a_whole_sequence(tmp_path):
    f = _found(_record(tmp_path / "r", "is_zero"))["is_weight_zeroed"]
    assert f.severity == "warning" and f.evidence["values"]["sequences"] == 7
    assert [(t.step, t.sample_id) for t in f.tokens] == [(s, 3) for s in range(5, 12)]


@pytest.mark.parametrize(("defect", "sample", "missing"), [("reward_nan", 2, 0), ("reward_none", 0, 7)])
def test_a_nan_or_missing_reward_is_critical(tmp_path, defect, sample, missing):
    f = _found(_record(tmp_path / "r", defect))["reward_nonfinite"]
    assert f.severity == "critical" and f.first_step == 5
    assert f.evidence["values"] == {"samples": 7, "missing": missing, "steps": list(range(5, 12))}
    assert (f.tokens[0].step, f.tokens[0].sample_id) == (5, sample)


def test_a_reward_that_never_varies(tmp_path):
    f = _found(_record(tmp_path / "r", "reward_constant"))["reward_constant"]
    assert f.severity == "warning" and (f.first_step, f.last_step) == (0, 11)
    assert f.evidence["values"]["groups"] == 24 and f.evidence["values"]["reward"] == 0.0
    # fewer than 10 steps: not yet a finding
    assert "reward_constant" not in _found(_record(tmp_path / "short", "reward_constant", steps=9))


def test_a_step_count_unlike_the_loss_mask(clean, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    run = Path(shutil.copytree(clean, tmp_path / "r"))
    for part in (run / "steps").rglob("*.parquet"):
        t = pq.read_table(part)
        df = t.to_pandas()
        df.loc[df["step"] == 7, "n_tokens"] = 48  # 64 loss-token rows recorded
        pq.write_table(t.from_pandas(df, schema=t.schema, preserve_index=False), part)
    f = _found(run)["token_count_mismatch"]
    assert f.severity == "warning" and (f.first_step, f.last_step) == (7, 7)
    assert f.evidence["values"] == {"steps": [7], "n_tokens": [48], "in_mask": [64]}


def test_a_run_without_the_columns_is_not_checked(tmp_path):
    with Recorder(tmp_path / "r") as rec:
        for step in range(3):
            with rec.step(step) as st:
                st.log(loss=0.1)
    result = examine(tmp_path / "r", only=list(INTEGRITY))
    assert result.findings == []
    assert {n.detector for n in result.not_checked} == set(INTEGRITY)


def test_no_shipped_sample_run_gets_an_integrity_finding():
    root = Path(__file__).resolve().parents[2] / "sample_runs"
    runs = sorted(root.iterdir())
    assert len(runs) >= 9
    unchecked = {}
    for run in runs:
        result = examine(run, only=list(INTEGRITY))
        assert result.findings == [], run.name
        unchecked[run.name] = [n.detector for n in result.not_checked]
    # runs without an inference engine's IS weights leave that detector unchecked; the K&K runs kept a
    # token budget on every step (no step's rows are its whole loss mask); the smollm runs have 8 steps
    budget = ("is_weight_zeroed", "token_count_mismatch")
    short = ("is_weight_zeroed", "reward_constant")
    want = {"lab_grpo_rollout": ()}
    want |= {r: budget for r in ("lab_kk_ar_lopti", "lab_kk_grpo", "lab_kk_tr_grpo")}
    want |= {r: short for r in ("smollm_ar_lopti", "smollm_grpo", "smollm_tr_grpo")}
    assert {r: tuple(u) for r, u in unchecked.items()} == {
        r: want.get(r, ("is_weight_zeroed",)) for r in unchecked
    }


def test_tokens_trained_in_two_updates_count_once_against_n_tokens(tmp_path):
    """mu = 2: every token has a row per update; steps.n_tokens counts (sample_id, position) once, and so
    must the detector (a mu = 2 sample run got 100 false warnings when rows were counted)."""
    gen = torch.Generator().manual_seed(0)
    with Recorder(tmp_path / "r") as rec:
        for step in range(3):
            ids = torch.randint(0, 32, (4, 16), generator=gen)
            with rec.step(step) as st:
                for update in range(2):
                    logits = torch.randn(4, 16, 32, generator=gen, requires_grad=True)
                    lp = torch.log_softmax(logits, -1).gather(2, ids[..., None]).squeeze(-1)
                    st.track(
                        lp,
                        token_ids=ids,
                        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
                        sample_ids=torch.arange(4),
                        group_ids=torch.tensor([0, 0, 1, 1]),
                        update_id=update,
                    )
                    st.backward(-lp.mean())
    result = examine(tmp_path / "r", only=["token_count_mismatch"])
    assert result.findings == [] and result.not_checked == []
