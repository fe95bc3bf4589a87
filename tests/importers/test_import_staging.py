"""Imports go through a staging folder (tokengrad.importers.staging): `--out` gets the whole run or nothing,
an `--out` holding anything else is refused in one line, a failed import leaves nothing behind, and what a
killed import left is removed so that the re-run equals a clean import. (Real SIGKILLs: test_import_kills.)"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest
from importer_dumps import write_nemo_rl, write_prime_rl, write_trl_completions

from tokengrad import load_run
from tokengrad.cli import main
from tokengrad.importers import import_run, staging
from tokengrad.read.runs import list_runs
from tokengrad.record.store import claim
from tokengrad.schema import TABLES

DUMPS = {"nemo_rl": write_nemo_rl, "prime_rl": write_prime_rl, "trl_completions": write_trl_completions}


def leftovers(out) -> list[str]:
    return sorted(p.name for p in out.parent.glob(staging.staging_prefix(out) + "*"))


def tables(run_dir) -> dict[str, pd.DataFrame]:
    """Every table of a run, rows in a fixed order (file order is no part of the run format)."""
    run = load_run(run_dir)
    out = {}
    for table in ("steps", "samples"):
        df = run.table(table)
        order = [c for c in ("step", "rank", "sample_id") if c in df]
        out[table] = df.sort_values(order).reset_index(drop=True)
    keys = ["step", "rank", "sample_id", "position"]
    out["tokens"] = run.tokens().sort_values(keys).reset_index(drop=True) if run.files("tokens") else None
    return out


def assert_same_run(got, want) -> None:
    a, b = tables(got), tables(want)
    for table in a:
        if b[table] is None:
            assert a[table] is None
        else:
            pd.testing.assert_frame_equal(a[table], b[table])
    meta_a, meta_b = (json.loads((p / "meta.json").read_text()) for p in (got, want))
    assert meta_a["imported"]["rows"] == meta_b["imported"]["rows"] and meta_a["finished"] is True


def hold(folder, pid: int) -> None:
    """The claim a process with `pid` holds on a staging folder (as record/store/claim.py writes it)."""
    path = claim.lock_path(folder, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": time.time()}))


@pytest.mark.parametrize("fmt", sorted(DUMPS))
def test_an_out_holding_anything_else_is_refused_in_one_line_and_kept(tmp_path, fmt, capsys):
    DUMPS[fmt](tmp_path / "src")
    out = tmp_path / "out"
    (out / "tokens").mkdir(parents=True)  # what an import killed by an earlier tokengrad left
    (out / "notes.txt").write_text("mine")
    assert main(["import", fmt, str(tmp_path / "src"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{out} is not empty and holds no run (notes.txt, tokens;" in err
    assert "delete it or choose a new folder" in err
    assert (out / "notes.txt").read_text() == "mine" and leftovers(out) == []
    (out / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=f"^{out} already holds a run; choose a new folder"):
        import_run(fmt, tmp_path / "src", out)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        import_run(fmt, tmp_path / "src", tmp_path / "file")


def test_an_empty_out_is_filled(tmp_path):
    write_nemo_rl(tmp_path / "src")
    (tmp_path / "out").mkdir()
    meta = import_run("nemo_rl", tmp_path / "src", tmp_path / "out")
    assert meta["imported"]["rows"]["samples"] == 8  # 2 steps x 4 samples
    assert load_run(tmp_path / "out").steps["step"].tolist() == [1, 2]
    assert not claim.lock_path(tmp_path / "out", 0).exists() and leftovers(tmp_path / "out") == []


def test_a_failed_import_leaves_neither_out_nor_a_staging_folder(tmp_path):
    write_nemo_rl(tmp_path / "src", steps=(1, 2, 3))
    bad = tmp_path / "src" / "train_data_step3.jsonl"
    bad.write_text(bad.read_text().replace('"advantages"', '"advantage_x"', 1))  # step 3 lacks a field
    with pytest.raises(ValueError, match="advantages"):
        import_run("nemo_rl", tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path / "out") == []


@pytest.mark.parametrize("fmt", sorted(DUMPS))
def test_what_a_killed_import_left_is_removed_and_the_rerun_equals_a_clean_import(tmp_path, fmt):
    DUMPS[fmt](tmp_path / "src")
    import_run(fmt, tmp_path / "src", tmp_path / "clean")
    out = tmp_path / "out"
    # an attempt killed once staged: the whole run and its meta.json in the staging folder, not yet moved,
    # claimed by a process that is gone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = tmp_path / f"{staging.staging_prefix(out)}{gone.pid}-0000"
    import_run(fmt, tmp_path / "src", left)
    hold(left, gone.pid)
    assert list_runs(tmp_path) == [str(tmp_path / "clean")]  # a staged copy is never listed as a run
    with pytest.warns(RuntimeWarning, match=f"removed {left}, the partial import"):
        import_run(fmt, tmp_path / "src", out)
    assert leftovers(out) == []
    assert_same_run(out, tmp_path / "clean")
    for table in TABLES:  # every file of the run is the re-run's: one per rank and step, none twice
        assert sorted(p.name for p in (out / table).rglob("*.parquet")) == sorted(
            p.name for p in (tmp_path / "clean" / table).rglob("*.parquet")
        )


def test_an_import_into_out_that_still_runs_is_refused_and_left_alone(tmp_path):
    write_nemo_rl(tmp_path / "src")
    out = tmp_path / "out"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / f"{staging.staging_prefix(out)}{live.pid}-0000"
        hold(busy, live.pid)
        running = f"another import into {out} is running: .*pid {live.pid}"
        with pytest.raises(claim.RunClaimedError, match=running):
            import_run("nemo_rl", tmp_path / "src", out)
        assert claim.lock_path(busy, 0).exists() and not out.exists()
    finally:
        live.kill()
        live.wait()


def test_an_out_filled_while_the_import_ran_keeps_its_content(tmp_path, monkeypatch):
    write_nemo_rl(tmp_path / "src")
    out = tmp_path / "out"

    def fill(name):  # another process writes into `out` just before the import moves its run there
        out.mkdir()
        (out / "theirs.txt").write_text("theirs")

    monkeypatch.setattr(staging, "fault_point", fill)
    with pytest.raises(ValueError, match=f"{out} was filled by something else while the import ran"):
        import_run("nemo_rl", tmp_path / "src", out)
    assert [p.name for p in out.iterdir()] == ["theirs.txt"] and leftovers(out) == []
