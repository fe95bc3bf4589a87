"""Every benchmark in --smoke mode, one after another in this interpreter (torch is imported once).

    python benchmarks/smoke.py                     # all of benchmarks/bench_*.py
    python benchmarks/smoke.py bench_scale.py      # some of them

Each script runs exactly as from its command line (`python benchmarks/NAME --smoke`) at tiny sizes and
prints every figure it promises; its output comes under a line `== NAME ==` and ends with
`== NAME: ok in S s ==` or `== NAME: FAILED ==` and the traceback. The timings mean nothing at these sizes
and nothing about them is checked: tests/test_benchmarks.py checks that each figure is printed, with a
finite number. Exit status 1 when any script failed.
"""

from __future__ import annotations

import runpy
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    return sorted(HERE.glob("bench_*.py"))


def run_one(script: Path) -> bool:
    print(f"== {script.name} ==", flush=True)
    argv, t = sys.argv, time.perf_counter()
    sys.argv = [str(script), "--smoke"]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # scripts that return an exit status
        if e.code not in (None, 0):
            print(f"== {script.name}: FAILED (exit {e.code}) ==", flush=True)
            return False
    except Exception:
        traceback.print_exc(file=sys.stdout)
        print(f"== {script.name}: FAILED ==", flush=True)
        return False
    finally:
        sys.argv = argv
    print(f"== {script.name}: ok in {time.perf_counter() - t:.1f} s ==", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    names = argv if argv is not None else sys.argv[1:]
    chosen = [HERE / n for n in names] if names else scripts()
    ok = [run_one(s) for s in chosen]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
