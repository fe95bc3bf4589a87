"""`tokengrad dashboard` without a folder: the runs below the current folder, and where there are none the
demo run shipped inside the package, under a banner that says how to record a run."""

from __future__ import annotations

import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest
from synthetic_runs import write_synthetic_run

from tokengrad.app.views import welcome
from tokengrad.cli import dashboard
from tokengrad.read import served_root

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "tokengrad" / "app" / "streamlit_app.py"
DEMO_RUN = served_root.DEMO_ROOT / "smollm_grpo"


def test_no_folder_serves_the_runs_below_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(served_root.ENV_ROOT, raising=False)
    monkeypatch.chdir(tmp_path)
    assert served_root.serve_plan(None) == (served_root.DEMO_ROOT.resolve(), tmp_path.resolve())
    write_synthetic_run(tmp_path / "sweep" / "seed0", n_steps=2)
    assert served_root.serve_plan(None) == (tmp_path.resolve(), None)


def test_a_named_folder_is_served_even_without_runs(tmp_path, monkeypatch):
    monkeypatch.delenv(served_root.ENV_ROOT, raising=False)
    assert served_root.serve_plan(str(tmp_path)) == (tmp_path.resolve(), None)
    monkeypatch.setenv(served_root.ENV_ROOT, str(tmp_path))
    assert served_root.serve_plan(None) == (tmp_path.resolve(), None)


def test_cli_without_a_folder_starts_the_app_on_the_demo(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(served_root.ENV_ROOT, raising=False)
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(dashboard.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    assert dashboard.cli_dashboard([]) == 0
    app_args = calls[0][calls[0].index("--") + 1 :]
    demo = str(served_root.DEMO_ROOT.resolve())
    assert app_args == ["--root", demo, served_root.NO_RUNS_FLAG, str(tmp_path.resolve())]
    out = capsys.readouterr().out
    assert f"no runs under {tmp_path.resolve()}" in out and f"serving {demo}" in out
    assert "site-packages" not in out and "sample_runs" not in out


def test_the_demo_page_says_how_to_record_and_shows_the_demo_run(tmp_path, monkeypatch):
    monkeypatch.delenv(served_root.ENV_ROOT, raising=False)
    demo = str(served_root.DEMO_ROOT)
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py", "--root", demo, served_root.NO_RUNS_FLAG, "/empty"])
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    banners = [i.value for i in at.info if "No runs under `/empty`" in i.value]
    assert banners == [welcome.message("/empty")]
    assert all(way in banners[0] for way in welcome.RECORD_WAYS)
    from tokengrad.app.views.sidebar import RUNS_KEY

    assert [Path(r) for r in at.session_state[RUNS_KEY]] == [DEMO_RUN.resolve()]
    assert at.get("plotly_chart"), "the overview draws the demo run"


def test_no_banner_on_a_named_folder(tmp_path, monkeypatch):
    write_synthetic_run(tmp_path / "run", n_steps=2)
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py", "--root", str(tmp_path)])
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception and not [i for i in at.info if "No runs under" in i.value]
