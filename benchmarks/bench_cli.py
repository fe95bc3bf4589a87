"""Commands that should answer at once: `--help` of every command, bad `tokengrad train` values, and
`scripts/trl_example.py --help`, each in a fresh interpreter as a user types it (target <= 1 s).

    python benchmarks/bench_cli.py               # 5 runs of each command, medians
    python benchmarks/bench_cli.py --reps 11
    python benchmarks/bench_cli.py --smoke       # one run each: runs, prints every figure

Prints per command the median wall seconds, the median CPU seconds of the child (the figure to read on a
busy machine: wall time there mostly measures other jobs) and whether torch was imported. The references
are an empty interpreter and `import torch` alone, the cost these commands avoid.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from measure import SMOKE_HELP, line, use_smoke, verdict  # noqa: E402

TARGET_S = 1.0
CONFIG = "configs/tiny_charset.toml"
TRAIN = ["-m", "tokengrad.cli", "train"]
# label -> the python arguments (run from the repository root)
COMMANDS = {
    "tokengrad --help": ["-m", "tokengrad.cli", "--help"],
    "tokengrad train --help": [*TRAIN, "--help"],
    "train, bad value (lr=-1)": [*TRAIN, CONFIG, "lr=-1"],
    "train, misspelt key (stpes=3)": [*TRAIN, CONFIG, "stpes=3"],
    "train, unknown rule (weighting=tr-grpo)": [*TRAIN, CONFIG, "weighting=tr-grpo"],
    "train, bad rule parameter": [*TRAIN, CONFIG, "weighting=ar", "weighting_params.eta=1"],
    **{
        f"tokengrad {name} --help": ["-m", "tokengrad.cli", name, "--help"]
        for name in ("dashboard", "export", "inspect", "publish", "doctor", "watch")
    },
    "scripts/trl_example.py --help": ["scripts/trl_example.py", "--help"],
}
REFERENCES = {
    "empty interpreter (python -c pass)": ["-c", "pass"],
    "import torch alone": ["-c", "import torch"],
}
# Appended to every command: reports on stderr whether torch was imported by the time the command exited.
PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))"
)


def run_once(args: list[str]) -> tuple[float, float, bool]:
    """(wall s, child CPU s, torch imported) of `python ARGS` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TOKENGRAD_DEBUG", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    cmd = [sys.executable, "-c", f"{PROBE}\nimport runpy; {_runner(args)}"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if "torch loaded:" not in out.stderr:
        raise RuntimeError(f"python {' '.join(args)} did not finish:\n{out.stderr[-2000:]}")
    return wall, cpu, "torch loaded: True" in out.stderr


def _runner(args: list[str]) -> str:
    """The command line `python ARGS` as code run after PROBE (sys.argv as the command would see it)."""
    if args[0] == "-c":
        return f"exec({args[1]!r})"
    if args[0] == "-m":
        argv, run = [args[1], *args[2:]], f"runpy.run_module({args[1]!r}, run_name='__main__')"
    else:
        argv, run = args, f"runpy.run_path({args[0]!r}, run_name='__main__')"
    return f"sys.argv = {argv!r}; {run}"


def measure(args: list[str], reps: int) -> tuple[float, float, bool]:
    runs = [run_once(args) for _ in range(reps)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        any(r[2] for r in runs),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="runs of each command (medians are printed)")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    reps = 1 if use_smoke(a.smoke) else a.reps
    print(
        f"fresh interpreter per run, {reps} run(s) each; median wall s / median CPU s; target <= {TARGET_S} s"
    )
    line("command", "wall s / CPU s", "target", "")
    for label, args in REFERENCES.items():
        wall, cpu, _ = measure(args, reps)
        line(label, f"{wall:.2f} / {cpu:.2f}", "reference")
    for label, args in COMMANDS.items():
        wall, cpu, torch_loaded = measure(args, reps)
        note = verdict(wall, TARGET_S) + ("; imports torch" if torch_loaded else "")
        line(label, f"{wall:.2f} / {cpu:.2f}", f"<= {TARGET_S} s", note)


if __name__ == "__main__":
    main()
