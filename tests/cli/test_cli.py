"""`tokengrad` CLI: one error boundary, so every subcommand turns a user error into one line and exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokengrad import cli

REPO = Path(__file__).resolve().parents[2]


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


QUICK_PATHS = """
import contextlib, io, json, sys
from tokengrad.cli import main

codes, err = {}, io.StringIO()
for name, argv in {
    "help": ["--help"],
    "train help": ["train", "--help"],
    "bad value": ["train", "configs/tiny_charset.toml", "lr=-1"],
    "bad key": ["train", "configs/tiny_charset.toml", "stpes=3"],
    "bad rule": ["train", "configs/tiny_charset.toml", "weighting=tr-grpo"],
    "bad rule parameter": ["train", "configs/tiny_charset.toml", "weighting=ar", "weighting_params.eta=1"],
    "bad model": ["train", "configs/tiny_charset.toml", "model=gpt-9"],
    "bad method": ["train", "configs/tiny_charset.toml", "attribute_method=exact"],
}.items():
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(err):
        try:
            codes[name] = main(argv)
        except SystemExit as e:
            codes[name] = e.code
    if name == "train help":
        help_text = out.getvalue()
before = sorted(m for m in ("torch", "transformers", "trl") if m in sys.modules)
import tokengrad.train.trainer  # noqa: the control: the check sees a real torch import
print(json.dumps({"codes": codes, "loaded": before, "control": "torch" in sys.modules,
                  "err": err.getvalue(), "help": help_text}))
"""


@pytest.mark.subprocess
def test_help_and_bad_config_values_answer_without_importing_torch():
    """`tokengrad --help`, `train --help` and every kind of bad config value (a number out of range, a
    misspelt key, an unknown rule, model or method, a rule parameter it does not take) are answered
    before torch is imported (in a fresh interpreter), so they take a fraction of a second."""
    out = subprocess.run(
        [sys.executable, "-c", QUICK_PATHS], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["codes"] == {"help": 0, "train help": 0, **dict.fromkeys(list(got["codes"])[2:], 2)}, got
    assert len(got["codes"]) == 8 and got["loaded"] == [] and got["control"] is True, got
    err = got["err"].splitlines()
    assert err[0] == "tokengrad train: error: config key 'lr' = -1.0: must be > 0", err
    assert "'stpes' (did you mean 'steps'?)" in err[1], err
    assert "unknown name 'tr-grpo'; known: ['ar', 'ar_lopti', " in err[2], err
    assert "weighting rule 'ar' has no parameters ['eta']; it takes ['alpha']" in err[3], err
    assert "model must be one of ['lab-add', 'lab-kk', 'smollm2-135m-instruct', 'tiny']" in err[4], err
    assert "unknown name 'exact'; known: ['central_difference', 'jvp', 'shard_difference']" in err[5], err
    assert "one of: ar, ar_lopti, clip_cov, cw_grpo, grpo, kl_cov, lopti, tr_grpo" in got["help"]


@pytest.mark.subprocess
def test_trl_example_help_answers_without_importing_trl():
    """scripts/trl_example.py reads its arguments before importing torch, transformers and trl."""
    code = (
        "import runpy, sys; sys.argv = ['trl_example.py', '--help']\n"
        "try:\n    runpy.run_path('scripts/trl_example.py', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--run-dir" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]", out.stdout
