"""Run.sql on the process's one DuckDB database: each query's views are its own (runs and threads never see
each other's tables), nothing is left in the shared catalog, and a forked child opens its own database."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from synthetic_runs import write_synthetic_run

from tokengrad import load_run
from tokengrad.read import duck


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared_db")
    for name, n_steps in (("a", 3), ("b", 5)):
        write_synthetic_run(root / name, n_steps=n_steps, n_samples=2, n_tok=4, bucket_every=1, n_layers=2)
    return root / "a", root / "b"


def _steps(path) -> int:
    return int(load_run(path).sql("SELECT count(DISTINCT step) AS n FROM tokens")["n"].iloc[0])


def test_runs_and_threads_see_their_own_tables(two_runs):
    a, b = two_runs
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(_steps, [a, b] * 8))
    assert got == [3, 5] * 8


def test_queries_leave_nothing_in_the_shared_catalog(two_runs):
    run = load_run(two_runs[0])
    assert run.sql("SELECT 1 AS one")["one"].iloc[0] == 1  # names no table: no view needed
    assert len(run.sql("SELECT * FROM steps JOIN layers USING (step)")) > 0
    con = duck.cursor()
    left = con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0]
    assert left == 0


def _child(path, out):
    out.put(_steps(path))


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_opens_its_own_database(two_runs):
    a, b = two_runs
    assert _steps(a) == 3  # the parent's database is open before the fork
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(b, out))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and out.get(timeout=5) == 5


@pytest.mark.subprocess
@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_exits_cleanly(two_runs):
    """The parent's database is never closed in the child, not even by the interpreter at exit (it would
    wait for threads that did not follow the fork, or abort)."""
    code = textwrap.dedent(
        f"""
        import os, sys
        from tokengrad import load_run
        def steps(p):
            return int(load_run(p).sql("SELECT count(DISTINCT step) AS n FROM tokens")["n"].iloc[0])
        steps({str(two_runs[0])!r})
        for query in (True, False):
            pid = os.fork()
            if pid == 0:
                if query:
                    steps({str(two_runs[1])!r})
                sys.exit(0)  # the interpreter's own exit, not os._exit
            print(os.waitpid(pid, 0)[1])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0 and out.stdout.split() == ["0", "0"], out.stdout + out.stderr
