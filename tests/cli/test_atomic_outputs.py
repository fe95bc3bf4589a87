"""`tokengrad export` and `tokengrad publish` write under temporary names and rename: a process killed half
way leaves no file under a final name that is partial (a 0-byte PNG, one without its 300 dpi, a cut event
file that looks complete)."""

from __future__ import annotations

import sys
import types

import plotly.graph_objects as go
import pytest
from PIL import Image

from tokengrad.figures import export
from tokengrad.figures.figureset import FigureSpec


def fake_kaleido(monkeypatch, fail_after: int | None = None):
    """kaleido.Kaleido as a stand-in (no browser): PNG bytes per figure, or a kill on figure `fail_after`.
    Returns the paths export's atomic writer was handed."""
    import io

    calls, written = [], []

    class Kaleido:
        def __init__(self, **kopts):
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def calc_fig(self, fig, opts=None):
            calls.append(fig)
            if fail_after is not None and len(calls) > fail_after:
                raise KeyboardInterrupt
            buf = io.BytesIO()
            Image.new("RGB", (8, 8), "white").save(buf, format="PNG")
            return buf.getvalue()

    real_write = export.write_atomic

    def write(path, data):
        written.append(str(path))
        return real_write(path, data)

    monkeypatch.setitem(sys.modules, "kaleido", types.SimpleNamespace(Kaleido=Kaleido))
    monkeypatch.setattr(export, "write_atomic", write)
    monkeypatch.setattr(export, "_browser", lambda: "/usr/bin/chromium")
    return written


def specs() -> list[FigureSpec]:
    return [FigureSpec(name=f"fig{i}", figure=go.Figure(go.Scatter(y=[1, 2]))) for i in range(3)]


def test_exported_pngs_appear_complete_with_their_dpi(tmp_path, monkeypatch):
    written = fake_kaleido(monkeypatch)
    paths = export.write_static(specs(), tmp_path, "png")
    assert len(written) == 3  # every file through the temporary-name-and-rename writer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig0.png", "fig1.png", "fig2.png"]
    for p in paths:
        with Image.open(p) as im:
            assert tuple(round(d) for d in im.info["dpi"]) == (300, 300)


def test_an_interrupted_export_leaves_no_partial_file_under_a_final_name(tmp_path, monkeypatch):
    fake_kaleido(monkeypatch, fail_after=1)
    with pytest.raises(KeyboardInterrupt):
        export.write_static(specs(), tmp_path, "png")
    assert [p.name for p in tmp_path.iterdir()] == ["fig0.png"]  # the one finished before the kill, whole
    with Image.open(tmp_path / "fig0.png") as im:
        assert tuple(round(d) for d in im.info["dpi"]) == (300, 300)


def test_an_interrupted_publish_leaves_no_event_file(tmp_path, monkeypatch):
    from test_reliability import record

    from tokengrad.cli import main
    from tokengrad.integrations.trackers import backends
    from tokengrad.integrations.trackers.backends import Scalar

    run_dir = record(tmp_path / "run", range(3))

    def killed(run, trackers):
        trackers[0].publish([Scalar("a", 0, 1.0)])  # the event file exists, half written
        trackers[0].flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(backends, "publish_run", killed)
    with pytest.raises(KeyboardInterrupt):
        main(["publish", str(run_dir), "--tensorboard", str(tmp_path / "tb")])
    assert not (tmp_path / "tb").exists() or not list((tmp_path / "tb").iterdir())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # staging removed
    monkeypatch.undo()
    assert main(["publish", str(run_dir), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert [p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir()] == [True]
