"""scripts/study.py --steps N: runs of different lengths summarised over one horizon."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import study  # noqa: E402


def fake_run(n_steps: int) -> SimpleNamespace:
    steps = pd.DataFrame({"step": range(n_steps), "grad_norm": 1.0})
    rows = [
        (s, d, acc)
        for s, accs in ((-1, (0.2, 0.0)), (4, (0.5, 0.1)), (9, (0.9, 0.3)))
        for d, acc in zip((2, 3), accs)
    ]
    evals = pd.DataFrame(rows, columns=["step", "difficulty", "accuracy"]).assign(n=10)
    return SimpleNamespace(steps=steps, evals=evals[evals["step"] < n_steps], meta={"run_name": "grpo-s0"})


def test_horizon_cuts_steps_and_evals():
    steps, evals = study.first_steps(fake_run(10), 5)
    assert steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert sorted(set(evals["step"])) == [-1, 4]
    m = study.eval_metrics(evals)
    # by hand: step 4 accuracies 0.5 and 0.1 on 10 puzzles each, step -1 0.2 and 0.0
    assert m["acc_final"] == pytest.approx(0.3) and m["acc_start"] == pytest.approx(0.1)
    assert m["gain_d2"] == pytest.approx(0.3) and m["gain_d3"] == pytest.approx(0.1)


def test_no_horizon_keeps_the_whole_run():
    run = fake_run(10)
    steps, evals = study.first_steps(run, None)
    assert len(steps) == 10 and study.eval_metrics(evals)["acc_final"] == pytest.approx(0.6)


def test_a_run_shorter_than_the_horizon_is_refused():
    with pytest.raises(SystemExit, match="grpo-s0: 5 steps, fewer than --steps 8"):
        study.first_steps(fake_run(5), 8)


def test_a_metric_one_seed_recorded_is_counted_and_labelled_as_such():
    from study_report import summary_tables

    nan = float("nan")
    df = pd.DataFrame(
        {
            "rule": ["grpo"] * 3 + ["tr_grpo"] * 3,
            "seed": [0, 1, 2] * 2,
            "acc": [0.1, 0.2, 0.3, 0.2, 0.3, 0.4],
            "low_update": [0.5, nan, nan, 0.4, nan, nan],  # bucket analysis on seed 0 only
        }
    )
    est, diff = summary_tables(df, ["low_update"], ["grpo", "tr_grpo"])
    assert est["seeds"].tolist() == [1, 1] and est["low_update"].tolist() == [
        "0.500 (one seed)",
        "0.400 (one seed)",
    ]
    assert diff["pairs"].tolist() == [1] and diff["low_update"].tolist() == ["-0.100 (one seed)"]
    est, diff = summary_tables(df, ["acc"], ["grpo", "tr_grpo"])
    assert (
        est["seeds"].tolist() == [3, 3] and diff["acc"].iloc[0] == "0.100 [0.100, 0.100]"
    )  # every pair +0.1
