"""Integrity across ranks (tokengrad.doctor.detect_ranks): a two-rank run (a prime-rl import, whose sample ids
are global) with one rank's tokens folder lost, or with sample ids repeated across its ranks, gets the
finding naming the ranks and samples; the intact run, one-rank runs and the shipped sample runs get none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from importer_dumps import write_prime_rl

from tokengrad.doctor.engine import examine
from tokengrad.importers import import_run

RANKS = ["rank_without_tokens", "sample_id_repeated"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """3 steps x 2 ranks x 2 sequences: rank 0 has sample ids 0, 1 and rank 1 has 2, 3 in every step."""
    root = tmp_path_factory.mktemp("ranks")
    write_prime_rl(root / "src", steps=(1, 2, 3))
    import_run("prime_rl", root / "src", root / "run")
    return root / "run"


def copy(run: Path, tmp_path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "r"))


def test_the_intact_two_rank_run_has_no_finding_and_both_are_checked(two_ranks):
    result = examine(two_ranks, only=RANKS)
    assert result.findings == [] and result.not_checked == []


def test_a_rank_whose_tokens_folder_is_gone(two_ranks, tmp_path):
    run = copy(two_ranks, tmp_path)
    shutil.rmtree(run / "tokens" / "rank001")
    (f,) = examine(run, only=RANKS).findings
    assert f.id == "rank_without_tokens" and f.severity == "warning"
    assert f.evidence["values"] == {"missing": [1], "with_tokens": [0], "world_size": 2}
    assert (f.first_step, f.last_step) == (1, 3)
    assert f.message.startswith("rank(s) 1 recorded no token rows while rank(s) 0 did (world_size 2): 50 %")
    # while the run is live, a rank that has not written yet is no finding: only one that recorded steps
    assert examine(run, only=["rank_without_tokens"], upto=2).findings == []


def test_sample_ids_repeated_across_ranks(two_ranks, tmp_path):
    run = copy(two_ranks, tmp_path)
    for part in (run / "tokens" / "rank001").glob("*.parquet"):
        t = pq.read_table(part)
        ids = t["sample_id"]
        t = t.set_column(
            t.schema.get_field_index("sample_id"), "sample_id", pc.if_else(pc.equal(ids, 2), 0, ids)
        )
        pq.write_table(t, part)
    (f,) = examine(run, only=RANKS).findings
    # per step: sample 0 on ranks 0 and 1, of the 3 distinct ids 0, 1, 3
    assert f.id == "sample_id_repeated" and f.severity == "warning" and (f.first_step, f.last_step) == (1, 3)
    assert f.evidence["values"] == {"sample_ids": 3, "share": pytest.approx(1 / 3), "steps": [1, 2, 3]}
    assert [(t.step, t.sample_id) for t in f.tokens] == [(1, 0), (2, 0), (3, 0)]
    assert "first: step 1 sample 0 on ranks 0, 1" in f.message


def test_one_rank_runs_are_not_checked_for_repeats_and_sample_runs_are_clean():
    root = Path(__file__).resolve().parents[2] / "sample_runs"
    runs = sorted(root.iterdir())
    assert len(runs) >= 9
    for run in runs:
        result = examine(run, only=RANKS)
        assert result.findings == [], run.name
        assert [(n.detector, n.reason) for n in result.not_checked] == [
            ("sample_id_repeated", "the token rows come from one rank")
        ]
