"""Run metadata is strict JSON (record/store/strict_json.py): NaN and inf written as null, a key JSON cannot
hold refused naming its path before anything is claimed, a failed open leaves no lock, and a Recorder is
not let add to the rows a killed process left without meta.json."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_reliability import TOKENS_PER_STEP, record, record_step, step_counts

from tokengrad import Recorder, load_run
from tokengrad.record import RunInfo
from tokengrad.record.store import claim
from tokengrad.record.store.strict_json import to_json


def strict_load(path):
    """json.loads as a strict reader parses: NaN, Infinity and -Infinity are no JSON."""

    def refuse(name):
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null_and_the_run_reopens(tmp_path):
    config = {"lr": float("nan"), "clip": [1.0, float("inf"), -math.inf], "beta": np.float32(0.25)}
    with Recorder(tmp_path / "r", config=config, info=RunInfo(name="r")) as rec:
        record_step(rec, 0)
    meta = strict_load(tmp_path / "r" / "meta.json")
    assert meta["config"] == {"lr": None, "clip": [1.0, None, None], "beta": 0.25}
    assert strict_load(tmp_path / "r" / "ranks" / "rank000.json")["last_step"] == 0
    with Recorder(tmp_path / "r", config=config, info=RunInfo(name="r")) as rec:  # the same run: not refused
        record_step(rec, 1)
    assert load_run(tmp_path / "r").steps["step"].tolist() == [0, 1]


def test_a_non_string_key_is_refused_naming_its_path_and_leaves_nothing(tmp_path):
    config = {"optim": {"betas": {(0.9, 0.99): "adam"}}}
    with pytest.raises(ValueError) as err:
        Recorder(tmp_path / "r", config=config).open()
    msg = str(err.value)
    assert msg == (
        "meta.json key config.optim.betas.(0.9, 0.99) is a tuple, not a string: JSON keys are text; "
        "rename it (e.g. to a string) before recording"
    )
    assert not (tmp_path / "r").exists()  # nothing claimed, nothing created
    with pytest.raises(ValueError, match=r"key config\.3 is a int"):
        Recorder(tmp_path / "r", config={3: "x"})
    with pytest.raises(ValueError, match=r"key a\[1\]\.b\.None is a NoneType"):
        to_json({"a": [0, {"b": {None: 1}}]})


def test_a_failed_open_leaves_no_lock_and_no_writer(tmp_path):
    record(tmp_path / "r", range(1))
    with pytest.raises(ValueError, match="already holds another run"):
        Recorder(tmp_path / "r", config={"lr": 2.0}, info=RunInfo(name="r")).open()
    assert not claim.lock_path(tmp_path / "r", 0).exists()
    assert load_run(tmp_path / "r").steps["step"].tolist() == [0]


def test_rows_a_killed_process_left_without_meta_are_refused_or_resumed_cleanly(tmp_path):
    run_dir = record(tmp_path / "r", range(2))
    (run_dir / "meta.json").unlink()  # killed before its metadata reached the disk
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    with pytest.raises(ValueError) as err:
        Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r")).open()
    assert str(err.value).startswith(f"{run_dir} holds 4 data file(s) of rank 0 but no meta.json")
    assert "\n" not in str(err.value) and "resume_step=N" in str(err.value)
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before  # untouched, no lock
    # starting over through resume_step=0: the same rows as one uninterrupted recording
    with pytest.warns(RuntimeWarning, match="removed .* rows recorded after the checkpoint"):
        rec = Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r"), resume_step=0).open()
    for step in range(3):
        record_step(rec, step)
    rec.close()
    clean = record(tmp_path / "clean", range(3))
    assert step_counts(load_run(run_dir)) == step_counts(load_run(clean))
    assert step_counts(load_run(run_dir))["tokens"] == [TOKENS_PER_STEP] * 3
    assert len(load_run(run_dir).samples) == len(load_run(clean).samples) == 6
