"""The live doctor's cost on the training thread and the time from a gradient spike to its alert.

    python benchmarks/bench_doctor.py --smoke        # 30 steps (about 20 s)
    python benchmarks/bench_doctor.py                # 200 steps

A scalar-only loop (`st.log(grad_norm=..., kl=..., ...)`, a sleep standing for the step's compute) is run
twice, without and with `Recorder(doctor=Doctor(...))`. Printed: the median time per step the training
thread spends in the recorder's step boundary (begin_step + end_step) in both runs and their difference
(target <= 1 ms), the direct cost of the doctor's own calls on that thread (committed() + halt check, timed
over 100,000 calls), the doctor thread's diagnosis time per committed step, and the wall time from the end
of the step after a spike (when its files are known to be on disk) to the spike's alert. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tokengrad.record import Doctor, Recorder  # noqa: E402


def _scalars(step: int, spike: int) -> dict:
    g = 40.0 if step == spike else 1.0 + 0.1 * math.sin(step)
    return dict(grad_norm=g, kl=0.02, loss=0.0, reward_mean=0.5, reward_std=0.4, entropy_mean=0.5)


def _loop(run_dir: Path, n: int, compute_s: float, doctor: Doctor | None, marks: dict) -> list[float]:
    """Per-step seconds spent in the step boundary (begin_step + end_step) on the training thread."""
    spent = []
    with Recorder(run_dir, doctor=doctor) as rec:
        for step in range(n):
            t0 = time.perf_counter()
            st = rec.begin_step(step)
            t1 = time.perf_counter()
            time.sleep(compute_s)  # the step's compute
            st.log(**_scalars(step, marks["spike"]))
            t2 = time.perf_counter()
            rec.end_step()
            t3 = time.perf_counter()
            if step == marks["spike"] + 1:
                marks["known"] = t3  # step `spike` is on disk from here on
            spent.append((t1 - t0) + (t3 - t2))
        marks["latency"] = list(rec.live_doctor.latency) if rec.live_doctor else []
    return spent


def _direct_cost(calls: int = 100_000) -> float:
    """Seconds per committed() + halt check, the doctor's only work on the training thread."""
    with tempfile.TemporaryDirectory() as tmp:
        with Recorder(Path(tmp) / "r", doctor=Doctor()) as rec:
            live = rec.live_doctor
            t0 = time.perf_counter()
            for i in range(calls):
                live.committed(-1 - i)  # negative: nothing on disk, the doctor reads an empty prefix
                _ = rec.halt_finding
            return (time.perf_counter() - t0) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="30 steps")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--compute-s", type=float, default=0.05, help="seconds of stand-in compute per step")
    a = p.parse_args()
    n = 30 if a.smoke else a.steps
    alerts: list[float] = []

    def on_finding(f):
        if f.id == "gradient_spike":
            alerts.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        marks_off = {"spike": n // 2}
        off = _loop(Path(tmp) / "off", n, a.compute_s, None, marks_off)
        marks = {"spike": n // 2}
        doctor = Doctor(on_finding=on_finding, min_confidence=0.0, detectors=("gradient_spike",))
        on = _loop(Path(tmp) / "on", n, a.compute_s, doctor, marks)
    m_off, m_on = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(f"steps                                   {n} (stand-in compute {a.compute_s * 1e3:.0f} ms)")
    print(f"step boundary, no doctor    median ms   {m_off:.3f}")
    print(f"step boundary, doctor on    median ms   {m_on:.3f}")
    print(f"training-thread cost of the doctor, ms  {m_on - m_off:+.3f}   (target <= 1 ms)")
    print(f"committed() + halt check, us per call   {_direct_cost() * 1e6:.2f}")
    lat = [s for _, s in marks["latency"]]
    if lat:
        print(
            f"diagnosis per committed step, s         median {statistics.median(lat):.3f}, max {max(lat):.3f}"
        )
    if alerts and "known" in marks:
        print(f"spike at step {marks['spike']} -> alert, s           {alerts[0] - marks['known']:.3f}")
    else:
        print("spike alert                             not raised")


if __name__ == "__main__":
    main()
