"""The claim on a run directory (record/store/claim.py): one process and one Recorder per rank at a time,
taken by the trainer before its model loads, released on exit, stale claims broken or named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from test_reliability import record_step
from test_trainer import tiny

from tokengrad import Recorder, load_run
from tokengrad.read import claim_file
from tokengrad.record import RunInfo
from tokengrad.record.store import claim
from tokengrad.train import trainer


def hold(run_dir, pid: int, host: str | None = None) -> None:
    """A lock file as another process would leave it."""
    path = claim.lock_path(run_dir, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"pid": pid, "host": host or socket.gethostname(), "started": time.time()}
    path.write_text(json.dumps(info))


@pytest.fixture
def other_process():
    """A live process that is not this one (its pid stands for another trainer's)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def open_recorder(run_dir) -> Recorder:
    return Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r")).open()


def test_a_second_recorder_in_one_process_is_refused_and_loses_no_rows(tmp_path):
    a = open_recorder(tmp_path / "r")
    with pytest.raises(claim.RunClaimedError, match="another open Recorder in this process"):
        open_recorder(tmp_path / "r")
    for step in range(3):
        record_step(a, step)
    a.close()
    assert not claim.lock_path(tmp_path / "r", 0).exists()  # released on close
    b = open_recorder(tmp_path / "r")  # the same run may be opened again once the first one is closed
    record_step(b, 3)
    b.close()
    run = load_run(tmp_path / "r")
    assert run.steps["step"].tolist() == [0, 1, 2, 3] and run.rows_dropped == 0


def test_a_run_claimed_by_a_live_process_is_refused_with_its_pid_and_the_lock(tmp_path, other_process):
    hold(tmp_path / "r", other_process)
    with pytest.raises(claim.RunClaimedError) as err:
        open_recorder(tmp_path / "r")
    assert f"pid {other_process} on host {socket.gethostname()}" in str(err.value)
    assert str(claim.lock_path(tmp_path / "r", 0)) in str(err.value)
    assert not (tmp_path / "r" / "meta.json").exists()  # nothing was written


def test_a_stale_claim_on_this_host_is_broken_with_a_warning(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    hold(tmp_path / "r", gone.pid)
    with pytest.warns(RuntimeWarning, match=f"broke the stale claim .* pid {gone.pid}"):
        rec = open_recorder(tmp_path / "r")
    assert json.loads(claim.lock_path(tmp_path / "r", 0).read_text())["pid"] != gone.pid
    rec.close()


def test_a_claim_from_another_host_is_broken_by_deleting_the_named_file(tmp_path):
    hold(tmp_path / "r", 1, host="other-node")
    with pytest.raises(claim.RunClaimedError, match="delete .*rank000.lock to break the claim") as err:
        open_recorder(tmp_path / "r")
    assert "host other-node" in str(err.value)
    claim.lock_path(tmp_path / "r", 0).unlink()  # the documented way to break it
    open_recorder(tmp_path / "r").close()


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_trainer_or_a_resume_is_refused_before_the_model_loads(
    tmp_path, monkeypatch, other_process, resume
):
    """While another trainer holds the run (its claim taken, meta.json not yet written: the model-load
    window), a second trainer and a --resume are both refused before loading anything."""
    cfg = trainer.load_config(None, tiny(tmp_path, resume=resume))
    hold(tmp_path / "run", other_process)
    monkeypatch.setattr(trainer, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(claim.RunClaimedError, match="is being recorded by pid"):
        trainer.Trainer(cfg).setup()


def test_the_trainer_releases_its_claim_when_it_ends_or_fails(tmp_path, monkeypatch):
    run_dir = trainer.train(tiny(tmp_path, steps=1))
    assert not claim.lock_path(run_dir, 0).exists()
    monkeypatch.setattr(trainer, "load_model", lambda *a, **k: (_ for _ in ()).throw(OSError("no model")))
    with pytest.raises(OSError, match="no model"):
        trainer.Trainer(trainer.load_config(None, tiny(tmp_path, name="b"))).setup()
    assert not claim.lock_path(tmp_path / "b", 0).exists()


def test_a_claim_names_its_process_by_start_time_and_boot(tmp_path):
    rec = open_recorder(tmp_path / "r")
    info = json.loads(claim.lock_path(tmp_path / "r", 0).read_text())
    rec.close()
    assert info["pid"] == os.getpid() and info["boot_id"] == claim_file.boot_id()
    assert info["proc_start"] == claim_file.process_state(os.getpid())[1]


@pytest.mark.parametrize(
    "fields, why",
    [
        # a restarted container: this process got the pid of the one that took the claim
        ({"pid": "SELF", "proc_start": 1}, "its pid now belongs to another process"),
        ({"pid": "SELF", "proc_start": None, "started": 1.0}, "started after the claim was taken"),
        ({"pid": "SELF", "proc_start": None}, "its pid is this process's own"),  # an older claim, just now
        ({"pid": "OTHER", "proc_start": 1}, "its pid now belongs to another process"),
        ({"pid": "OTHER", "boot_id": "an-earlier-boot"}, "before this machine restarted"),
    ],
)
def test_a_claim_of_an_earlier_process_with_a_live_pid_is_stale(tmp_path, other_process, fields, why):
    pid = {"SELF": os.getpid(), "OTHER": other_process}[fields["pid"]]
    path = claim.lock_path(tmp_path / "r", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**claim_file.this_process(), **fields, "pid": pid}))
    with pytest.warns(RuntimeWarning, match=f"broke the stale claim .* of pid {pid}: .*{why}"):
        open_recorder(tmp_path / "r").close()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"garbage \x00\xff not json", "is not JSON"),
        (b"", "is empty"),
        (b"[1, 2, 3]", "holds a JSON list, not an object"),
        (b'{"pid": "123", "host": "h"}', 'pid "123" is not a process id'),
        (b'{"pid": 99999999999, "host": "h"}', "is not a process id"),
        (b'{"pid": 5}', "names no host"),
        (b'{"pid": 5, "host": "h", "pad": "' + b"x" * 50_000_000 + b'"}', "is larger than 64 KiB"),
        ("FIFO", "is not a regular file"),
        ("LINK", "cannot be opened"),
    ],
)
def test_a_lock_file_that_is_no_claim_is_refused_with_what_is_wrong(tmp_path, content, message):
    path = claim.lock_path(tmp_path / "r", 0)
    path.parent.mkdir(parents=True)
    if content == "FIFO":
        os.mkfifo(path)  # opening it for reading must not wait for a writer
    elif content == "LINK":
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_bytes(content)
    start = time.monotonic()
    with pytest.raises(claim.RunClaimedError, match="cannot be claimed") as err:
        open_recorder(tmp_path / "r")
    assert message in str(err.value) and f"delete {path} to break the claim" in str(err.value)
    assert time.monotonic() - start < 5 and os.path.lexists(path)  # refused at once, left in place


def test_a_forked_child_neither_holds_nor_releases_its_parents_claim(tmp_path):
    c = claim.take(tmp_path / "r")
    pid = os.fork()
    if pid == 0:  # the child: the parent's claim is not its own
        try:
            c.release()
            code = 0 if claim.lock_path(tmp_path / "r", 0).exists() else 1
            try:
                claim.take(tmp_path / "r")
                code = 2
            except claim.RunClaimedError as err:
                code = code or (0 if f"pid {os.getppid()}" in str(err) else 3)
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    c.release()
    assert not claim.lock_path(tmp_path / "r", 0).exists()
