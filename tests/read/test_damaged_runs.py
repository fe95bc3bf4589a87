"""Fault injection: each damage of tests/damaged_runs.py on the shipped 8-step run gives the finding that
names what was lost, the checks that needed the data say "not checked", the rest of the run still reads,
and `tokengrad inspect` says the same. Time bounds here are hang guards only (the figures:
benchmarks/bench_damaged.py). The many-files damages use 50 files here; at 5,000 in the slow tier.
"""

from __future__ import annotations

import json
import random
import time
import warnings
from pathlib import Path

import pytest
from damaged_runs import damaged_run

from tokengrad import load_run
from tokengrad.cli.inspect import summarize
from tokengrad.doctor.engine import examine
from tokengrad.doctor.report import as_json, as_text
from tokengrad.read import layout

HANG_GUARD_S = 60  # generous: a hang, not a speed, fails it

CASES = {  # damage -> (finding id, message start, steps of the finding, token rows still read)
    "steps_cut": (
        "unreadable_files",
        "steps 0–7 of the steps table (rank 0) unreadable: steps/rank000/s00000001-00000008.parquet: "
        "corrupt:",
        (0, 7),
        732,
    ),
    "tokens_cut": (
        "unreadable_files",
        "steps 0–7 of the tokens table (rank 0) unreadable: tokens/rank000/s00000001-00000008.parquet: "
        "corrupt:",
        (0, 7),
        0,
    ),
    "steps_nan_step": (
        "unreadable_files",
        "steps 0–7 of the steps table (rank 0) not read: steps/rank000/s00000001-00000008.parquet: column "
        "'step' is double here, the run format says int32",
        (0, 7),
        732,
    ),
    "steps_many_empty": (
        "unreadable_files",
        "commits 9–58 of the steps table (rank 0; which steps, no file says) unreadable: 50 files "
        "steps/rank000/s00000009-00000009.parquet … s00000058-00000058.parquet: corrupt: ArrowInvalid:",
        (None, None),
        732,
    ),
    "rank_missing": (
        "rank_missing",
        "steps 0–7 of the steps table (rank 1) missing: no steps/rank001 folder, though meta.json says "
        "world_size 2",
        (0, 7),
        2 * 732,
    ),
    "ranks_same_steps": (
        "unreadable_files",
        "steps 0–7 of the steps table (rank 1) not read: steps/rank001/s00000001-00000008.parquet: its rows "
        "are rank 0's, which the rank000 folder holds",
        (0, 7),
        732,  # rank 0's rows once, not twice
    ),
}


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _diagnose(run: Path):
    t0 = time.perf_counter()
    result = examine(run)
    assert time.perf_counter() - t0 < HANG_GUARD_S
    return result


@pytest.mark.parametrize("damage", sorted(CASES))
def test_each_damage_is_a_finding_and_its_checks_are_not_checked(tmp_path, quiet, damage):
    finding_id, message, steps, token_rows = CASES[damage]
    run = damaged_run(tmp_path / "r", damage, n=50)
    result = _diagnose(run)
    hits = [f for f in result.findings if f.id == finding_id and f.message.startswith(message)]
    assert len(hits) == 1, [f.message for f in result.findings]
    assert hits[0].severity == "critical" and (hits[0].first_step, hits[0].last_step) == steps
    text = as_text(result.findings, not_checked=result.not_checked)
    assert "no findings" not in text and message in text
    report = as_json(result.findings, [str(run)], not_checked=result.not_checked)
    assert message in json.dumps(report, ensure_ascii=False)
    table = {"tokens_cut": "tokens", "ranks_same_steps": "layers"}.get(damage, "steps")  # the first loss
    lost = [n for n in result.not_checked if n.detector == "gradient_spike"]  # reads steps, layers, tokens
    assert (
        lost
        and lost[0].reason.startswith(f"steps 0–7 of the {table} table")
        or damage.startswith("steps_many")
    ), result.not_checked
    assert lost and lost[0].reason.endswith("(a files finding names them)")
    assert len(load_run(run).tokens(columns=["step"])) == token_rows  # the rest still reads
    assert f"lost       {message}" in summarize(load_run(run))


def test_the_healthy_run_has_no_files_finding(quiet):
    from damaged_runs import BASE

    result = examine(BASE, only=["unreadable_files", "rank_missing"])
    assert result.findings == [] and result.not_checked == []


def test_zero_row_files_are_left_out_silently(tmp_path, quiet):
    run = load_run(damaged_run(tmp_path / "r", "steps_many_zero_rows", n=50))
    assert len(run.files("steps")) == 1 and run.unreadable == []
    assert run.steps["step"].tolist() == list(range(8))


def test_many_skipped_files_warn_a_bounded_number_of_times(tmp_path):
    run_dir = damaged_run(tmp_path / "r", "steps_many_empty", n=50)
    with pytest.warns(RuntimeWarning) as told:
        run = load_run(run_dir)
        assert run.steps["step"].tolist() == list(range(8))
    assert len(run.warnings) == 50 and len(run.unreadable) == 50
    assert len(told) == 21  # 20 one by one, then one that says more were skipped


def _resolve_by_brute_force(found):
    """The first definition of layout.resolve: every kept range compared with every file (O(n^2))."""
    kept, redundant = [], []
    for first, last, p in sorted(found, key=lambda e: (-(e[1] - e[0]), e[0], e[2].name)):
        if any(k[0] <= first and last <= k[1] for k in kept):
            redundant.append(p)
            continue
        kept.append((first, last, p))
    return sorted(kept, key=lambda k: k[0]), sorted(redundant)


def test_resolve_agrees_with_the_brute_force_on_random_layouts(tmp_path):
    rng = random.Random(0)
    for _ in range(300):
        found = []
        for i in range(rng.randint(1, 12)):
            first = rng.randint(0, 30)
            found.append((first, first + rng.choice([0, 0, 1, 3, 8, 20]), tmp_path / f"f{i}.parquet"))
        kept, redundant = layout.resolve(found)  # no file exists: step ranges unknown, none excluded
        want_kept, want_redundant = _resolve_by_brute_force(found)
        assert [(k.first, k.last, k.path) for k in kept] == want_kept
        assert redundant == want_redundant


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["steps_many_empty", "steps_many_zero_rows"])
def test_five_thousand_small_files_stay_bounded(tmp_path, quiet, damage):
    run = damaged_run(tmp_path / "r", damage)  # 5,000 files
    t0 = time.perf_counter()
    assert load_run(run).steps["step"].tolist() == list(range(8))
    assert time.perf_counter() - t0 < HANG_GUARD_S
    found = [f for f in _diagnose(run).findings if f.id == "unreadable_files"]
    if damage == "steps_many_empty":
        assert len(found) == 1 and found[0].evidence["values"]["n_files"] == 5000
    else:
        assert found == []
