"""`tokengrad export` at its edges: a figure that fails leaves the others written and is reported; a
token holding a line break or a bidi override still draws; a full or read-only folder is named in a clear
error and holds no partial file. The browser is replaced by a stand-in that returns real PNG bytes (the
static path without Chromium); the last tests use Chromium and real tmpfs mounts (root)."""

import errno
import io
import os
import pathlib
import shutil
import subprocess

import pytest
from PIL import Image
from test_queries import _STEP0, _token_rows, _write, make_tiny_run

from tokengrad.cli.export import cli_export
from tokengrad.figures import export
from tokengrad.figures.export import OutputError, find_browser, output_error, write_atomic
from tokengrad.figures.figureset import build_figure_set
from tokengrad.read.runs import load_run

PNG_MAGIC, PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


def _png(size: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), "white").save(buf, format="PNG")
    return buf.getvalue()


class FakeKaleido:
    """kaleido.Kaleido's context manager and calc_fig: PNG bytes, or an error for figures named in `fail`
    (matched on the figure's JSON)."""

    fail: tuple[str, ...] = ()
    size = 64

    def __init__(self, **kopts):
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def calc_fig(self, fig, opts=None):
        if any(f in fig.to_json() for f in self.fail):
            raise RuntimeError("render failed: the page threw")
        return _png(self.size)


@pytest.fixture
def fake_browser(monkeypatch):
    import kaleido

    FakeKaleido.fail, FakeKaleido.size = (), 64
    monkeypatch.setattr(export, "_browser", lambda: "/fake/chromium")
    monkeypatch.setattr(kaleido, "Kaleido", FakeKaleido)
    return FakeKaleido


def _run_with_odd_tokens(path):
    """A tiny run whose tokens include one holding a line break and one holding an RTL override."""
    run_dir = make_tiny_run(path, name="odd")
    odd = [(s, pos, tok, p, adv, coef, loss) for s, pos, tok, p, adv, coef, loss in _STEP0]
    odd[0] = (0, 0, "a\nb", 0.05, 1.0, 0.5, True)  # low probability: the low cloud
    odd[3] = (0, 3, "x\u202ey", 0.95, 1.0, 0.5, True)  # high probability: the high cloud
    for f in (run_dir / "tokens").rglob("*.parquet"):
        f.unlink()
    vocab = ("a\nb", "cat", "x\u202ey", "dog", "<tool>", "Ġthe", "sat")
    _write(run_dir, "tokens", _token_rows(0, 0, odd, vocab=vocab))
    return run_dir


def _no_partial(folder):
    left = [p.name for p in folder.iterdir() if ".partial" in p.name]
    assert not left, left
    for p in folder.glob("*.png"):
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and data.endswith(PNG_END), p.name


def test_a_token_with_a_line_break_is_drawn_and_the_export_completes(tmp_path, fake_browser, capsys):
    run_dir = _run_with_odd_tokens(tmp_path / "odd")
    specs, notes, failed = build_figure_set({"odd": load_run(run_dir)}, max_words=30)
    assert failed == [] and "wordcloud_odd" in {s.name for s in specs}
    out = tmp_path / "figs"
    assert cli_export([str(run_dir), "--out", str(out)]) == 0
    assert (out / "wordcloud_odd.png").read_bytes().startswith(PNG_MAGIC)
    assert "failed" not in capsys.readouterr().err
    _no_partial(out)


def test_a_failing_figure_is_reported_and_the_others_written(tmp_path, fake_browser, monkeypatch, capsys):
    import tokengrad.figures.wordclouds as wc

    def boom(*a, **k):
        raise ValueError("anchor not supported for multiline text")

    monkeypatch.setattr(wc, "make_high_low_wordcloud_figure", boom)
    run_dir = make_tiny_run(tmp_path / "r", name="r")
    out = tmp_path / "figs"
    assert cli_export([str(run_dir), "--out", str(out), "--strict"]) == 3  # asked for: non-zero
    err = capsys.readouterr().err
    assert "failed wordcloud_r: ValueError: anchor not supported for multiline text" in err
    assert "1 figure(s) failed" in err
    written = {p.stem for p in out.glob("*.png")}
    assert "wordcloud_r" not in written and {"reward", "grad_norm", "gradient_share_r"} <= written
    # a figure the browser cannot render: listed, the rest written
    monkeypatch.undo()
    monkeypatch.setattr(export, "_browser", lambda: "/fake/chromium")
    import kaleido

    monkeypatch.setattr(kaleido, "Kaleido", FakeKaleido)
    FakeKaleido.fail = ("entropy (nats)",)
    shutil.rmtree(out)
    assert cli_export([str(run_dir), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "failed entropy.png: RuntimeError: render failed" in err
    assert (out / "reward.png").exists() and not (out / "entropy.png").exists()
    _no_partial(out)


def test_a_full_disk_says_so_names_the_folder_and_leaves_nothing_partial(
    tmp_path, fake_browser, monkeypatch, capsys
):
    run_dir = make_tiny_run(tmp_path / "r", name="r")
    out = tmp_path / "figs"
    real = pathlib.Path.write_bytes
    calls = []

    def fill_up(self, data):
        calls.append(self.name)
        if len(calls) == 3:  # captions.md and one figure fit; the next stops half-way
            real(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", fill_up)
    assert cli_export([str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"disk full: no space left in {out}" in err and "no partial file left behind" in err
    assert "Chromium" not in err and "install" not in err and "HTML" not in err and "[Errno" not in err
    # written under a temporary name and renamed: the one figure that fit is whole, the next is gone
    assert calls[1:] == [".headline_update_share.partial.png", ".reward.partial.png"]
    assert {p.name for p in out.iterdir()} == {"headline.csv", "captions.md", "headline_update_share.png"}
    _no_partial(out)


def test_a_read_only_or_forbidden_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    run_dir = make_tiny_run(tmp_path / "r", name="r")

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    assert cli_export([str(run_dir), "--out", str(tmp_path / "ro" / "figs")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write into {tmp_path / 'ro' / 'figs'}: read-only file system" in err
    denied = output_error(PermissionError(errno.EACCES, "Permission denied"), tmp_path / "x\x1b[2J")
    assert "permission denied" in str(denied) and "x\\x1b[2J" in str(denied)


def test_write_atomic_removes_its_temporary_file_on_failure(tmp_path):
    def half(p):
        p.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError, match="disk full"):
        write_atomic(tmp_path / "a.csv", half)
    assert list(tmp_path.iterdir()) == []
    assert write_atomic(tmp_path / "b.bin", b"whole").read_bytes() == b"whole"
    assert [p.name for p in tmp_path.iterdir()] == ["b.bin"]


# ---- second tier: real tmpfs mounts (root) and Chromium ------------------------------------------------


def _tmpfs(path, options):
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounts need root")


@pytest.mark.slow
@pytest.mark.browser
@needs_root
@pytest.mark.skipif(find_browser() is None, reason="no Chrome/Chromium")
def test_real_full_and_read_only_tmpfs(tmp_path, capsys):
    run_dir = _run_with_odd_tokens(tmp_path / "odd")
    full, ro = tmp_path / "full", tmp_path / "ro"
    _tmpfs(full, "size=150k")
    try:
        assert cli_export([str(run_dir), "--out", str(full / "figs")]) == 2
        err = capsys.readouterr().err
        assert f"disk full: no space left in {full / 'figs'}" in err and "Chromium" not in err
        _no_partial(full / "figs")
    finally:
        subprocess.run(["umount", str(full)], check=True)
    _tmpfs(ro, "size=1m,ro")
    try:
        assert cli_export([str(run_dir), "--out", str(ro / "figs")]) == 2
        assert f"cannot write into {ro / 'figs'}: read-only file system" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    # with room, the same run (a token holding a line break) exports in full with the real browser
    assert cli_export([str(run_dir), "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "wordcloud_odd.png").read_bytes().startswith(PNG_MAGIC)
