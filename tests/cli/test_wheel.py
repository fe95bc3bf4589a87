"""The package as a user gets it: the wheel built from this tree, installed into a fresh virtual environment
outside the repository, answers `tokengrad --version`, runs the doctor on the demo run it ships and serves
the dashboard with no arguments from an empty folder.

Nothing is downloaded: the wheel is built without build isolation (the test interpreter's setuptools) and
installed with --no-deps; the venv sees its dependencies through --system-site-packages plus a .pth line
naming this interpreter's site-packages, placed after the venv's own, so `import tokengrad` resolves to the
installed wheel (asserted) and never to the checkout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tokengrad._version import __version__
from tokengrad.cli.dashboard import DEFAULT_HOST, free_port, wait_healthy

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
# what the wheel is not built from: environments, build outputs, and the data and tests it never ships
NOT_SOURCE = (".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "artifacts", "runs")
NOT_SOURCE += ("sample_runs", "tests", "benchmarks", "docs", ".pytest_cache", ".cache")


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TOKENGRAD_RUNS_ROOT")}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the source tree (the build writes build/ and *.egg-info beside it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp)]
    _run(pip + [str(src)], cwd=tmp)
    (built,) = tmp.glob("tokengrad-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the repository with the wheel installed; returns its bin/ folder."""
    root = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(root)], cwd=root.parent)
    py = root / "bin" / "python"
    own = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout
    (Path(own.strip()) / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], cwd=root.parent)
    return root / "bin"


def test_the_wheel_holds_the_package_its_license_and_the_demo_run(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    info = f"tokengrad-{__version__}.dist-info"
    assert {n.split("/")[0] for n in names} == {"tokengrad", info}
    assert f"{info}/licenses/LICENSE" in names and "tokengrad/py.typed" in names
    assert "tokengrad/demo/smollm_grpo/meta.json" in names
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta and f"Version: {__version__}" in meta


def test_installed_version_doctor_and_dashboard_from_an_empty_folder(venv, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    where = "import tokengrad, tokengrad.read.served_root as s; print(tokengrad.__file__, s.DEMO_ROOT)"
    package, demo = _run([str(venv / "python"), "-c", where], empty).stdout.split()
    assert Path(package).is_relative_to(venv.parent) and Path(demo).is_relative_to(venv.parent)

    assert _run([str(venv / "tokengrad"), "--version"], empty).stdout.strip() == __version__
    doctor = _run([str(venv / "tokengrad"), "doctor", str(Path(demo) / "smollm_grpo")], empty)
    assert "smollm_grpo" in doctor.stdout and "Traceback" not in doctor.stderr

    port, log = free_port(), tmp_path / "dashboard.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TOKENGRAD_RUNS_ROOT")}
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(venv / "tokengrad"), "dashboard", "--port", str(port)],
            cwd=empty,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://{DEFAULT_HOST}:{port}", proc, timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the CLI and the streamlit child: one process group
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text()
    assert f"no runs under {empty.resolve()}" in text and f"serving {Path(demo).resolve()}" in text, text
    assert "Error" not in text and "Traceback" not in text, text
