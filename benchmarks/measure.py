"""Measuring helpers shared by the benchmark scripts: wall-clock splits, peak RSS, child processes, and
the report's aligned lines with a verdict against a target. Nothing here asserts: benchmarks print."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


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


def run_child(script: str, spec: dict) -> dict:
    """Run `script --child SPEC` (one memory measurement) in a fresh interpreter, so peaks of earlier work
    cannot hide it; returns the JSON object its last line prints."""
    cmd = [sys.executable, script, "--child", json.dumps(spec)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"child {spec} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "MISSES"


def line(what: str, measured: str, target: str = "", verdict: str = "") -> None:
    print(f"  {what:<46} {measured:>22}  {target:>12}  {verdict}")
