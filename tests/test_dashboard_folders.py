"""The dashboard reads only the folder it serves: the "Runs folder" box is confined to it unless the server
was started with --allow-any-folder, and run folders that are symlinks leading out of it are skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from synthetic_runs import write_synthetic_run

from tokengrad import list_runs
from tokengrad.cli import dashboard
from tokengrad.read import served_root

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "app" / "streamlit_app.py"


@pytest.fixture
def served(tmp_path) -> tuple[Path, Path]:
    """(served root with one run and a symlink to a run outside it, the outside folder)."""
    root, outside = tmp_path / "served", tmp_path / "private"
    write_synthetic_run(root / "inside", n_steps=2, seed=0)
    write_synthetic_run(outside / "secret", n_steps=2, seed=1)
    (root / "link_out").symlink_to(outside / "secret", target_is_directory=True)
    (root / "link_in").symlink_to(root / "inside", target_is_directory=True)
    return root, outside


def test_confine_accepts_the_root_and_below_only(served):
    root, outside = served
    assert served_root.confine(root / "inside", root) == (root / "inside").resolve()
    with pytest.raises(ValueError, match="outside the served folder.*--allow-any-folder"):
        served_root.confine(outside, root)
    with pytest.raises(ValueError, match="outside the served folder"):
        served_root.confine(root / "link_out", root)  # a symlink is judged by where it leads
    with pytest.raises(ValueError, match="outside the served folder"):
        served_root.confine(root / ".." / "private", root)
    assert served_root.confine(outside, root, allow_any=True) == outside.resolve()


def test_runs_behind_symlinks_leaving_the_root_are_skipped(served):
    root, _ = served
    assert [Path(r).name for r in list_runs(root)] == ["inside", "link_in"]
    assert [Path(r).name for r in list_runs(root, follow_links_out=True)] == ["inside", "link_in", "link_out"]


def test_the_flag_reaches_the_app_only_when_given():
    args = dashboard.build_parser().parse_args(["runs", "--allow-any-folder"])
    assert args.allow_any_folder is True
    assert dashboard.build_command(Path("runs"), "127.0.0.1", 8501, True)[-1] == dashboard.ALLOW_ANY_FLAG
    assert dashboard.ALLOW_ANY_FLAG not in dashboard.build_command(Path("runs"), "127.0.0.1", 8501)
    assert dashboard.build_command(Path("runs"), "127.0.0.1", 8501)[:9][-4:] == [
        "--server.address",
        "127.0.0.1",
        "--server.port",
        "8501",
    ]


def _app(root: Path, monkeypatch, *argv: str) -> AppTest:
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py", *argv])
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_runs_folder_box_refuses_a_folder_outside_the_root(served, monkeypatch):
    from app.views.sidebar import ROOT_KEY, RUNS_KEY

    root, outside = served
    at = _app(root, monkeypatch)
    assert [Path(r).name for r in at.session_state[RUNS_KEY]] == ["inside", "link_in"]
    at.text_input(key=ROOT_KEY).set_value(str(outside)).run()
    assert any("outside the served folder" in e.value for e in at.sidebar.error)
    assert at.session_state[RUNS_KEY] == []
    at = _app(root, monkeypatch, "--root", str(root), "--allow-any-folder")
    at.text_input(key=ROOT_KEY).set_value(str(outside)).run()
    assert not at.sidebar.error
    assert at.sidebar.multiselect[0].options == ["secret"]
