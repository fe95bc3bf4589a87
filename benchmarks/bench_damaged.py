"""Many small files in one table: `load_run` and the doctor on the shipped 8-step run with 5,000 more
files in steps/rank000, zero-row (valid, empty) or invalid (0 bytes), as tests/damaged_runs.py makes them.

    python benchmarks/bench_damaged.py --smoke       # 50 files (a few seconds; figures meaningless)
    python benchmarks/bench_damaged.py               # 5,000 files

Each figure is measured in a fresh interpreter (run_child), so neither import time nor an earlier peak is
shared: `load_run` is opening the run and reading its steps table (wall s); the doctor is
tokengrad.doctor.engine.examine on the run (wall s and the child's peak RSS, MB, imports included).
Targets: load_run <= 5 s, doctor <= 10 s and <= 300 MB. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from measure import SMOKE_HELP, line, run_child, use_smoke, verdict  # noqa: E402

DAMAGES = ("steps_many_zero_rows", "steps_many_empty")
TARGETS = {"load_run": 5.0, "doctor": 10.0, "doctor_mb": 300.0}


def _child(spec: dict) -> dict:
    """In a fresh interpreter: time one read of the prepared run; peak RSS at the end."""
    warnings.simplefilter("ignore", RuntimeWarning)  # the skipped files' warnings: measured, not shown
    t0 = time.perf_counter()
    if spec["what"] == "load_run":
        from tokengrad import load_run

        found = len(load_run(spec["run"]).steps)
    else:
        from tokengrad.doctor.engine import examine

        found = len(examine(spec["run"]).findings)
    seconds = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mb": peak_mb, "found": found}


def _measure(damage: str, n: int) -> None:
    from damaged_runs import damaged_run

    with tempfile.TemporaryDirectory() as tmp:
        run = str(damaged_run(Path(tmp) / damage, damage, n=n))
        time.sleep(2.5)  # older than read.layout.QUIET_S, as a run on disk is
        script = str(Path(__file__).resolve())
        load = run_child(script, {"what": "load_run", "run": run})
        doc = run_child(script, {"what": "doctor", "run": run})
    busy = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"[{damage}] {n:,} files in steps/rank000 ({os.cpu_count()} CPUs, load average {busy} after)")
    line(
        "load_run + steps, s", f"{load['seconds']:.2f}", "<= 5", verdict(load["seconds"], TARGETS["load_run"])
    )
    line("doctor, s", f"{doc['seconds']:.2f}", "<= 10", verdict(doc["seconds"], TARGETS["doctor"]))
    line(
        "doctor peak RSS, MB",
        f"{doc['peak_mb']:.0f}",
        "<= 300",
        verdict(doc["peak_mb"], TARGETS["doctor_mb"]),
    )
    line("doctor findings", str(doc["found"]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=5000, help="extra files in steps/rank000")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    n = 50 if use_smoke(args.smoke) else args.files
    for damage in DAMAGES:
        _measure(damage, n)


if __name__ == "__main__":
    main()
