"""Real `tokengrad import` processes killed by SIGKILL at chosen moments (tokengrad.faults), then run again
as a user would: the killed attempt leaves no run at --out, and the re-run equals an uninterrupted import
(every table, no (step, rank, sample_id, position) twice), for every importer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from importer_dumps import write_nemo_rl, write_prime_rl, write_trl_completions
from test_import_staging import assert_same_run, leftovers

from tokengrad import faults, load_run
from tokengrad.importers import import_run

REPO = Path(__file__).resolve().parents[2]
DUMPS = {
    "nemo_rl": lambda root: write_nemo_rl(root, steps=(1, 2, 3, 4)),
    "prime_rl": lambda root: write_prime_rl(root, steps=(1, 2, 3)),
    "trl_completions": lambda root: write_trl_completions(root, steps=(1, 2, 3, 4)),
}
# the first commit, one half-way, the rank status files written but not meta.json, the whole run staged
KILLS = ("commit:kill@1", "commit:kill@3", "meta:kill@1", "import_staged:kill")

pytestmark = pytest.mark.subprocess


def cli_import(fmt: str, src: Path, out: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    cmd = [sys.executable, "-m", "tokengrad.cli", "import", fmt, str(src), "--out", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("fmt", sorted(DUMPS))
def test_a_rerun_after_a_kill_equals_an_uninterrupted_import(tmp_path, fmt):
    DUMPS[fmt](tmp_path / "src")
    import_run(fmt, tmp_path / "src", tmp_path / "clean")
    for i, fault in enumerate(KILLS):
        out = tmp_path / f"out{i}"
        killed = cli_import(fmt, tmp_path / "src", out, fault)
        assert killed.returncode == -9, (fault, killed.stderr[-2000:])
        assert not out.exists() and len(leftovers(out)) == 1, fault  # the attempt stayed in staging
        again = cli_import(fmt, tmp_path / "src", out)
        assert again.returncode == 0, (fault, again.stderr[-2000:])
        assert "the partial import" in again.stderr and leftovers(out) == []
        assert_same_run(out, tmp_path / "clean")
        run = load_run(out)
        if run.files("tokens"):
            keys = "step, rank, sample_id, position"
            got = run.sql(f"SELECT count(*) AS n, count(DISTINCT ({keys})) AS d FROM tokens")
            assert got["n"][0] == got["d"][0] > 0
