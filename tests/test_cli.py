"""`tokengrad` CLI: one error boundary, so every subcommand turns a user error into one line and exit 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokengrad import cli

REPO = Path(__file__).resolve().parents[1]


class Result:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """`tokengrad ARGS` in this process (the subprocess test below checks the real entry point once)."""
    monkeypatch.delenv("TOKENGRAD_DEBUG", raising=False)
    monkeypatch.chdir(REPO)

    def run(*args):
        try:
            code = cli.main(list(args))
        except SystemExit as exit_:  # argparse's own usage errors
            code = exit_.code
        return Result(code, capsys.readouterr().err)

    return run


def _one_error_line(out, command):
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"tokengrad {command}: error: "), lines
    return lines[0]


@pytest.mark.parametrize("case", ["missing_run", "not_a_run", "bad_meta", "list_meta"])
def test_inspect_bad_paths(run_cli, tmp_path, case):
    path = tmp_path / "r"
    if case != "missing_run":
        path.mkdir()
    if case == "bad_meta":
        (path / "meta.json").write_text("{not json")
    if case == "list_meta":
        (path / "meta.json").write_text("[1, 2]")
    line = _one_error_line(run_cli("inspect", str(path)), "inspect")
    assert str(path) in line


@pytest.mark.parametrize(
    "text, suffix, words",
    [
        ("steps = [1,", ".toml", "invalid TOML"),
        ("steps: [1, 2\n  x: {", ".yaml", "invalid YAML"),
        ("mu = 2\n", ".toml", "'mu' is now 'num_iterations'"),
        ("weighting = 'nope'\n", ".toml", "unknown name 'nope'"),
        ("plugins = ['no_such_module_xyz']\n", ".toml", "cannot import plugin module 'no_such_module_xyz'"),
        ("lr = inf\n", ".toml", "config key 'lr' must be a finite number, got inf"),
        ("task = 'kk'\ntask_params = { bogus = 1 }\n", ".toml", "task 'kk': bad task_params ['bogus']"),
    ],
)
def test_train_config_errors(run_cli, tmp_path, text, suffix, words):
    cfg = tmp_path / f"c{suffix}"
    cfg.write_text(text)
    assert words in _one_error_line(run_cli("train", str(cfg)), "train")


def test_train_missing_config_file(run_cli, tmp_path):
    assert "does not exist" in _one_error_line(run_cli("train", str(tmp_path / "none.toml")), "train")


def test_dashboard_port_out_of_range(run_cli):
    out = run_cli("dashboard", "sample_runs", "--port", "99999")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "out of range 1-65535" in out.stderr


def test_export_unreadable_run(run_cli, tmp_path):
    out = run_cli("export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    line = _one_error_line(out, "export")
    assert "nothing" in line


def test_debug_env_keeps_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENGRAD_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        cli.main(["inspect", str(tmp_path / "missing")])


@pytest.mark.subprocess
def test_the_installed_entry_point_has_the_boundary(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TOKENGRAD_DEBUG"}
    cmd = [sys.executable, "-m", "tokengrad.cli", "inspect", str(tmp_path / "missing")]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().startswith("tokengrad inspect: error: "), out.stderr
