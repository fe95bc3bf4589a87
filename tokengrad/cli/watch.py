"""`tokengrad watch RUN`: tail a run written elsewhere and print each new finding once.

tokengrad watch runs/demo                      # every 10 s until the run is finished
tokengrad watch runs/demo --interval 2 --fail-on critical   # exit 1 at the first critical finding

It ends when the run does: exit 0 when it finished; exit 3, after one line on stderr saying why, when it
ended unfinished (stopped: its recording process is gone; crashed: the training loop raised).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tokengrad.doctor.finding import SEVERITIES
from tokengrad.doctor.report import as_text

ENDED_UNFINISHED = 3  # exit status of a run that stopped or crashed


def cli_watch(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tokengrad watch", description="Print new findings of a running run.")
    p.add_argument("run", help="run directory")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between two diagnoses")
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--min-severity", choices=SEVERITIES, default="warning")
    p.add_argument("--fail-on", choices=SEVERITIES[1:], help="exit 1 at the first finding this severe")
    p.add_argument("--json", action="store_true", help="one JSON object per new finding")
    args = p.parse_args(argv)
    from tokengrad.doctor.engine import diagnose  # after parsing: --help answers without pandas
    from tokengrad.read.runs import load_run
    from tokengrad.read.status import run_status

    if args.interval <= 0:
        raise ValueError(f"--interval must be > 0, got {args.interval}")
    seen: set[tuple] = set()
    start = time.monotonic()
    while True:
        load_run(args.run)  # a missing or unreadable run is an error
        status = run_status(args.run)  # read first: a last pass sees it all
        for f in diagnose(args.run):
            key = (f.id, f.severity, f.first_step if f.id == "gradient_spike" else None)
            if key in seen or not f.at_least(args.min_severity):
                continue
            seen.add(key)
            print(json.dumps(f.as_dict()) if args.json else as_text([f]).rsplit("\n", 1)[0], flush=True)
            if args.fail_on and f.at_least(args.fail_on):
                return 1
        if status.state in ("stopped", "crashed"):
            print(f"tokengrad watch: {args.run} {status.state}: {status.why}", file=sys.stderr, flush=True)
            return ENDED_UNFINISHED
        if status.state == "finished" or (
            args.timeout is not None and time.monotonic() - start >= args.timeout
        ):
            return 0
        time.sleep(args.interval)
