"""Measuring helpers shared by the benchmark scripts: wall-clock splits, peak RSS, child processes, and
the report's aligned lines with a verdict against a target. Nothing here asserts: benchmarks print."""

from __future__ import annotations

import io
import json
import runpy
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

SMOKE_HELP = (
    "tiny sizes, a few seconds: checks that the script runs and prints every figure (timings mean nothing)"
)
# Set by a script's --smoke: children run in this interpreter (one torch import for the whole smoke run).
SMOKE = {"on": False}


def use_smoke(on: bool) -> bool:
    """Record whether this run is a smoke run (see run_child); returns `on`."""
    SMOKE["on"] = bool(on)
    return SMOKE["on"]


class Splits:
    """Named wall-clock splits, several samples each."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)

    def median(self, name: str) -> float:
        return statistics.median(self.samples.get(name) or [float("nan")])


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_child(script: str, spec: dict, args: tuple = ()) -> dict:
    """Run `script [ARGS] --child SPEC` (one memory measurement) in a fresh interpreter, so peaks of earlier
    work cannot hide it; returns the JSON object its last line prints. In a smoke run the child runs in this
    interpreter through the same command line (its figures are then not measurements) with "smoke" set in
    SPEC, so the child applies the smoke sizes too."""
    if SMOKE["on"]:
        return _inline_child(script, {**spec, "smoke": True} if isinstance(spec, dict) else spec, args)
    cmd = [sys.executable, script, *args, "--child", json.dumps(spec)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"child {spec} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "MISSES"


def line(what: str, measured: str, target: str = "", verdict: str = "") -> None:
    print(f"  {what:<46} {measured:>22}  {target:>12}  {verdict}")


def _inline_child(script: str, spec: dict, args: tuple) -> dict:
    argv, out = sys.argv, io.StringIO()
    sys.argv = [script, *args, "--child", json.dumps(spec)]
    try:
        with redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    return json.loads(out.getvalue().strip().splitlines()[-1])
