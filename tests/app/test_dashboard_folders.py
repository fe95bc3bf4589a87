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

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "tokengrad" / "app" / "streamlit_app.py"


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
    from tokengrad.app.views.sidebar import ROOT_KEY, RUNS_KEY

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


def test_the_runs_folder_box_names_a_missing_folder_and_takes_relative_names_inside_the_root(
    tmp_path, monkeypatch
):
    from tokengrad.app.views.sidebar import ROOT_KEY, RUNS_KEY

    root = tmp_path / "served"
    write_synthetic_run(root / "sweep" / "lr1" / "seed0", n_steps=2, seed=0)  # two levels below
    write_synthetic_run(root / "sweep" / "lr2", n_steps=2, seed=1)
    at = _app(root, monkeypatch)
    assert at.sidebar.multiselect[0].options == ["sweep/lr1/seed0", "sweep/lr2"]
    at.text_input(key=ROOT_KEY).set_value("nope").run()
    assert any(f"{root.resolve() / 'nope'} does not exist" in e.value for e in at.sidebar.error)
    at.text_input(key=ROOT_KEY).set_value("sweep/lr1").run()  # relative: inside the served root
    assert not at.sidebar.error
    assert [Path(r).name for r in at.session_state[RUNS_KEY]] == ["seed0"]
    assert served_root.runs_below(root, depth=1) == []  # only the first level: no run there


def test_a_first_visit_picks_one_family_of_runs(tmp_path, monkeypatch):
    from synthetic_runs import write_meta

    from tokengrad.app.views.sidebar import PICK_KEY

    root = tmp_path / "served"
    for name, steps in (("a_long", 6), ("b_short", 2), ("c_short", 2)):
        write_synthetic_run(root / name, n_steps=steps, seed=0)
        write_meta(root / name, name, steps, 2)  # config: {"steps": ..., "bucket_every": 2}
    at = _app(root, monkeypatch)
    assert at.session_state[PICK_KEY] == ["b_short", "c_short"]  # the larger family (same length)
