"""A disk that fills up while the trainer saves its checkpoint: one line naming the disk and the last good
checkpoint, the previous checkpoint intact, no partial file a resume could pick up, the recorded rows kept,
and `--resume` continuing from the last good checkpoint. The default tier fakes ENOSPC where torch and
safetensors write; the subprocess tier fills a real tmpfs (root only)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import letters_task  # noqa: F401  (registers the "letters" task)
import pytest
import torch
from safetensors import SafetensorError

from tokengrad import load_run
from tokengrad.cli.train import _own_warnings_on_one_line
from tokengrad.train import durable
from tokengrad.train.checkpoint import (
    CheckpointNotWritten,
    checkpoint_path,
    load_trainer_state,
    save_checkpoint,
)
from tokengrad.train.trainer import train

REPO = Path(__file__).resolve().parents[2]


class _Tok:
    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_text("{}")


def _trained(model):
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return opt


def _save(run_dir, step, model, opt, on_error="count"):
    return save_checkpoint(
        run_dir,
        step,
        model=model,
        tokenizer=_Tok(),
        optimizer=opt,
        config={"lr": 0.1},
        data_step=step,
        on_error=on_error,
    )


class _FullFile:
    """A file on a disk with `room` bytes left: the write that would pass it fails with ENOSPC, after
    writing what fits (as a real disk does)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        n = len(memoryview(data).cast("B"))
        if n > self.room:
            self.f.write(memoryview(data).cast("B")[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= n
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def fill_disk_for_torch_save(monkeypatch, after: int = 0, room: int = 1000):
    """The files torch.save writes (opened "wb" in tokengrad.train.durable) hit a full disk, all but the
    first `after` of them."""
    real_open, opened = open, []

    def full_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return f
        opened.append(path)
        return f if len(opened) <= after else _FullFile(f, room)

    monkeypatch.setattr(durable, "open", full_open, raising=False)
    return opened


def leftovers(run_dir: Path) -> list[str]:
    """Temporary files or folders of a save, anywhere in the run directory."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if ".tmp" in p.name)


LINE = (
    r"tokengrad: the checkpoint after step {step} could not be written: the disk mounted at \S+ "
    r"\(\S+ \w+ free of \S+ \w+\) ran out of space \(No space left on device\); the last good checkpoint "
    r"is {ckpt}, after step {good}; free space, then continue from it with --resume"
)


def test_a_full_disk_in_torch_save_keeps_the_previous_checkpoint(tmp_path, tiny_model):
    opt = _trained(tiny_model)
    assert _save(tmp_path, 3, tiny_model, opt) == checkpoint_path(tmp_path)
    weights = (checkpoint_path(tmp_path) / "model" / "model.safetensors").read_bytes()
    mp = pytest.MonkeyPatch()
    fill_disk_for_torch_save(mp)
    try:
        with pytest.warns(RuntimeWarning) as got:
            assert _save(tmp_path, 5, tiny_model, opt) is None
        with pytest.raises(CheckpointNotWritten) as raised:
            _save(tmp_path, 6, tiny_model, opt, on_error="raise")
    finally:
        mp.undo()
    ckpt = re.escape(str(checkpoint_path(tmp_path)))
    assert re.fullmatch(LINE.format(step=5, ckpt=ckpt, good=3), str(got[0].message))
    # raised: the same sentence without the "tokengrad: " a warning starts with, and no "[Errno 28]"
    assert raised.value.errno == errno.ENOSPC and isinstance(raised.value, OSError)
    assert re.fullmatch(LINE.format(step=6, ckpt=ckpt, good=3)[len("tokengrad: ") :], str(raised.value))
    assert leftovers(tmp_path) == [] and not (tmp_path / ".checkpoint.old").exists()
    assert load_trainer_state(tmp_path)["step"] == 3
    assert (checkpoint_path(tmp_path) / "model" / "model.safetensors").read_bytes() == weights


def test_a_full_disk_in_the_weights_leaves_no_partial_folder(tmp_path, tiny_model, monkeypatch):
    """safetensors raises its own error ("... (os error 28)"), after writing part of the file."""
    opt = _trained(tiny_model)

    def full(path, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(tiny_model, "save_pretrained", full)
    with pytest.warns(
        RuntimeWarning, match="there is no earlier checkpoint, so --resume starts the run again"
    ):
        assert _save(tmp_path, 0, tiny_model, opt) is None
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_disk_names_the_error_and_the_last_good_checkpoint(tmp_path, tiny_model, monkeypatch):
    opt = _trained(tiny_model)
    _save(tmp_path, 1, tiny_model, opt)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tiny_model, "save_pretrained", read_only)
    with pytest.warns(RuntimeWarning) as got:
        _save(tmp_path, 2, tiny_model, opt)
    ckpt = checkpoint_path(tmp_path)
    assert str(got[0].message) == (
        f"tokengrad: the checkpoint after step 2 could not be written: {ckpt}: "
        f"[Errno {errno.EROFS}] Read-only file system; the last good checkpoint is {ckpt}, "
        "after step 1; continue from it with --resume"
    )


def test_a_bug_in_the_save_keeps_its_traceback_and_removes_the_partial_folder(
    tmp_path, tiny_model, monkeypatch
):
    opt = _trained(tiny_model)

    def bug(path, **kwargs):
        Path(path).mkdir(parents=True)
        raise TypeError("a bug, not the disk")

    monkeypatch.setattr(tiny_model, "save_pretrained", bug)
    with pytest.raises(TypeError, match="a bug, not the disk"):
        _save(tmp_path, 0, tiny_model, opt)
    assert list(tmp_path.iterdir()) == []


def test_write_error_finds_the_disk_error_behind_torch_and_safetensors():
    enospc = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise enospc
        except OSError:
            # as torch's zip writer does: the OSError is only the implicit context
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704")  # noqa: B904
    except RuntimeError as err:
        assert durable.write_error(err) is enospc
    found = durable.write_error(SafetensorError("I/O error: Disk quota exceeded (os error 122)"))
    assert found.errno == errno.EDQUOT and durable.is_disk_full(found)
    assert durable.write_error(ValueError("bad value")) is None
    assert not durable.is_disk_full(OSError(errno.EACCES, "Permission denied"))


def test_describe_disk_names_the_mount_point_of_a_folder_not_made_yet(tmp_path):
    text = durable.describe_disk(tmp_path / "not" / "yet")
    mount = durable.mount_point(tmp_path)
    assert os.path.ismount(mount) and str(tmp_path).startswith(str(mount))
    usage = shutil.disk_usage(mount)
    assert text.startswith(f"the disk mounted at {mount} (") and text.endswith(
        " free of " + durable._size(usage.total) + ")"
    )
    assert [durable._size(n) for n in (0, 999, 1500, 2_500_000, 7 * 10**12)] == [
        "0 B",
        "999 B",
        "1.5 KB",
        "2.5 MB",
        "7.0 TB",
    ]


def test_tokengrad_warnings_print_as_one_line_in_the_cli(monkeypatch):
    monkeypatch.delenv("TOKENGRAD_DEBUG", raising=False)
    usual = warnings.formatwarning
    with _own_warnings_on_one_line():
        own = warnings.formatwarning("tokengrad: the checkpoint\n  after step 3", RuntimeWarning, "x.py", 7)
        other = warnings.formatwarning("something else", UserWarning, "x.py", 7, "")
    assert own == "tokengrad: the checkpoint after step 3\n"
    assert other == "x.py:7: UserWarning: something else\n"
    assert warnings.formatwarning is usual


def _tiny(tmp_path, **overrides) -> dict:
    cfg = dict(
        model="tiny",
        task="letters",
        steps=3,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=8,
        bf16=False,
        progress=False,
        eval_every=0,
        checkpoint_every=1,
        run_dir=str(tmp_path / "run"),
    )
    return {**cfg, **overrides}


def test_a_run_whose_disk_fills_resumes_from_the_last_good_checkpoint(tmp_path):
    """The checkpoint after step 0 is written, those after steps 1 and 2 hit a full disk: the run keeps
    its recorded rows, its checkpoint stays at step 0, and a resume retrains steps 1-2 once each."""
    mp = pytest.MonkeyPatch()
    fill_disk_for_torch_save(mp, after=1)
    try:
        with pytest.warns(RuntimeWarning) as got:
            run_dir = train(_tiny(tmp_path))
    finally:
        mp.undo()
    lines = [str(w.message) for w in got if "could not be written" in str(w.message)]
    ckpt = re.escape(str(checkpoint_path(run_dir)))
    assert [bool(re.fullmatch(LINE.format(step=s, ckpt=ckpt, good=0), t)) for s, t in zip((1, 2), lines)] == [
        True,
        True,
    ]
    assert len(lines) == 2 and leftovers(run_dir) == []
    assert load_trainer_state(run_dir)["step"] == 0
    run = load_run(run_dir)
    assert run.steps["step"].tolist() == [0, 1, 2] and run.rows_dropped == 0  # the rows fitted
    with pytest.warns(RuntimeWarning, match="resuming at step 1: removed"):
        train(_tiny(tmp_path, resume=True))
    run = load_run(run_dir)
    assert run.steps["step"].tolist() == [0, 1, 2] and run.meta["finished"] is True
    keys = "step, pass_id, sample_id, position"
    got = run.sql(f"SELECT count(*) AS n, count(DISTINCT ({keys})) AS d FROM tokens")
    assert got["n"][0] == got["d"][0] > 0
    assert load_trainer_state(run_dir)["step"] == 2


# ---- a real full disk: a small tmpfs (root only) --------------------------------------------------------
CONFIG = """model = "tiny"
task = "arithmetic"
steps = 3
prompts_per_step = 2
group_size = 2
max_new_tokens = 8
bf16 = false
progress = false
eval_every = 0
checkpoint_every = 1
"""


def _mount_tmpfs(mnt: Path, size_kb: int) -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")


def _checkpoint_kb(tmp_path) -> int:
    """What one checkpoint of the tiny model takes on a tmpfs (whole 4 KB pages per file)."""
    from tokengrad.train.models import load_model

    model, tok = load_model("tiny")
    folder = save_checkpoint(
        tmp_path / "probe", 0, model=model, tokenizer=tok, optimizer=_trained(model), config={}
    )
    return sum(-(-p.stat().st_size // 4096) * 4 for p in folder.rglob("*") if p.is_file())


@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_real_full_tmpfs_ends_in_one_line_and_resumes(tmp_path):
    """Room for the first checkpoint and step 0's rows, not for a second checkpoint beside the first."""
    mnt, run_dir = tmp_path / "mnt", tmp_path / "mnt" / "run"
    size_kb = int(_checkpoint_kb(tmp_path) * 1.6) + 200
    _mount_tmpfs(mnt, size_kb)
    try:
        (tmp_path / "tiny.toml").write_text(CONFIG)
        env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
        env.pop("TOKENGRAD_FAULT", None)
        cmd = [
            sys.executable,
            "-m",
            "tokengrad.cli",
            "train",
            str(tmp_path / "tiny.toml"),
            f"run_dir={run_dir}",
        ]
        full = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert full.returncode == 0 and "Traceback" not in full.stderr, full.stderr[-3000:]
        lines = [s for s in full.stderr.splitlines() if "checkpoint after step" in s]
        assert lines, full.stderr[-3000:]
        assert lines[0].startswith("tokengrad: the checkpoint after step 1 could not be written: ")
        assert f"the disk mounted at {mnt} (" in lines[0]
        assert f"the last good checkpoint is {run_dir / 'checkpoint'}, after step 0" in lines[0]
        assert leftovers(run_dir) == [] and load_trainer_state(run_dir)["step"] == 0
        assert load_run(run_dir).steps["step"].tolist()[:1] == [0]  # at least step 0's rows read back
        subprocess.run(["mount", "-o", f"remount,size={size_kb * 10}k", str(mnt)], check=True)
        resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        run = load_run(run_dir)
        assert run.steps["step"].tolist() == [0, 1, 2] and run.meta["finished"] is True
        assert load_trainer_state(run_dir)["step"] == 2
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_cache_disk_leaves_no_partial_converted_model(tmp_path, tiny_model):
    """The one-time conversion of a downloaded model into the cache: a full disk names the disk and leaves
    neither a partial folder nor its temporary, so the next load converts again."""
    from tokengrad.train.models import save_converted

    out = tmp_path / "smollm2-135m-instruct"

    class Full:
        def save_pretrained(self, path):
            (Path(path) / "model.safetensors").write_bytes(b"\0" * 100)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OSError) as raised:
        save_converted(out, Full(), _Tok())
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value).startswith(f"[Errno 28] could not write the converted model to {out}: the disk ")
    assert str(raised.value).endswith("set TOKENGRAD_CACHE to a folder on another disk")
    assert list(tmp_path.iterdir()) == []
    save_converted(out, tiny_model, _Tok())  # the disk has room again
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    assert (out / "model.safetensors").stat().st_size > 1000 and (out / "tokenizer.json").is_file()
