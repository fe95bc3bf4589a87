"""Limits of the dashboard against hostile or careless input and long sessions: a URL naming runs many times
or naming more runs than are compared at once, and the server's malloc setting that keeps Live refresh
from growing the server's memory (benchmarks/bench_live_refresh.py measures it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from synthetic_runs import write_synthetic_run

from tokengrad.app.views import sidebar, urlstate
from tokengrad.cli import dashboard
from tokengrad.read import served_root

APP = Path(__file__).resolve().parents[2] / "tokengrad" / "app" / "streamlit_app.py"
N_RUNS = sidebar.MAX_RUNS + 2


@pytest.fixture(scope="module")
def many_runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("many")
    write_synthetic_run(root / "r00", n_steps=3, n_samples=2, n_tok=4, seed=0)
    for i in range(1, N_RUNS):
        shutil.copytree(root / "r00", root / f"r{i:02d}")
    return root


def _app(root: Path, monkeypatch, runs: str) -> AppTest:
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["runs"] = runs
    at.switch_page("views/evaluation.py")  # the lightest page: these tests are about the sidebar
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_url_names_are_taken_once_in_order():
    assert urlstate._names("b,a,,b,a,c") == ["b", "a", "c"]
    assert urlstate._names(",".join(["r00"] * 2000)) == ["r00"]


def test_a_run_named_2000_times_in_the_url_is_picked_once(many_runs, monkeypatch):
    at = _app(many_runs, monkeypatch, ",".join(["r03"] * 2000))
    assert at.multiselect(key=sidebar.PICK_KEY).value == ["r03"]
    assert at.session_state[sidebar.RUNS_KEY] == [str(many_runs / "r03")]
    assert not [c for c in at.sidebar.caption if "runs asked for" in c.value]  # nothing was cut


def test_more_runs_than_compared_at_once_keeps_the_first_with_a_note(many_runs, monkeypatch):
    names = [f"r{i:02d}" for i in reversed(range(N_RUNS))]  # URL order, not name order, decides
    at = _app(many_runs, monkeypatch, ",".join(names + names))
    assert at.multiselect(key=sidebar.PICK_KEY).value == names[: sidebar.MAX_RUNS]
    notes = [c.value for c in at.sidebar.caption if "runs asked for" in c.value]
    assert notes == [f"Showing the first 12 of the {N_RUNS} runs asked for: at most 12 are compared."]
    at.multiselect(key=sidebar.PICK_KEY).set_value(names[:2]).run()  # a new pick: the note goes
    assert not [c for c in at.sidebar.caption if "runs asked for" in c.value]


def test_the_server_runs_with_two_malloc_arenas_unless_told(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    assert dashboard.server_env()["MALLOC_ARENA_MAX"] == "2"
    assert dashboard.server_env()["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert dashboard.server_env()["MALLOC_ARENA_MAX"] == "8"
