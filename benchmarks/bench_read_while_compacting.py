"""Reads of a run while another process records it at full speed, compacting every 3 steps.

    python benchmarks/bench_read_while_compacting.py            # 1,000 tight-loop reads
    python benchmarks/bench_read_while_compacting.py --smoke    # 10 reads
    python benchmarks/bench_read_while_compacting.py --grace 0  # merged files removed at once (as before)

Each read opens the run, reads the steps table (pyarrow) and counts the token rows per step (DuckDB), as
the dashboard's live refresh does. A fresh run is started every 100 reads, so that reads stay quick
(compact_every=3 at full speed writes ~1,000 files a table a minute). A read fails when it raises; it is
wrong when a step is missing or read twice, or a step holds other than 64 token rows. Target: 0 failed
and 0 wrong reads (the reader guarantee of docs/run_format.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

TOKENS = 64  # 4 sequences x 16 tokens per step


def write(run_dir: str, grace: float | None) -> None:
    """The writer process: steps of random log-probs, as fast as they record, compact_every=3."""
    import torch

    from tokengrad import Recorder
    from tokengrad.record import Output
    from tokengrad.record.store import writer

    if grace is not None:
        writer.RETIRE_GRACE_S = grace

    with Recorder(run_dir, output=Output(compact_every=3)) as rec:
        for step in range(10**7):
            logits = torch.randn(4, 16, 32, requires_grad=True)  # [N, T, V]
            ids = torch.randint(0, 32, (4, 16))  # [N, T]
            with rec.step(step) as st:
                lp = torch.log_softmax(logits, -1).gather(2, ids[..., None]).squeeze(-1)  # [N, T]
                st.track(lp, token_ids=ids, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]))
                st.backward(-lp.mean())
                st.log(loss=0.0)


def read_once(run_dir: str) -> str:
    """'ok', 'wrong: ...' or 'failed: ...' for one read."""
    from tokengrad import load_run

    try:
        run = load_run(run_dir)
        steps = run.steps["step"].tolist()
        per = run.sql("SELECT step, count(*) AS n FROM tokens GROUP BY step")
    except Exception as err:  # noqa: BLE001 - every failure is counted by its type
        return f"failed: {type(err).__name__}"
    if steps != list(range(len(steps))):
        return "wrong: steps missing or read twice"
    if (per["n"] != TOKENS).any() or len(per) < len(steps):
        return "wrong: token rows missing or read twice"
    return "ok"


def read_during_writes(reads: int, grace: float | None, outcomes: Counter) -> int:
    """`reads` reads of a fresh run while a writer process records it; returns the steps it wrote."""
    from tokengrad import load_run

    run_dir = str(Path(tempfile.mkdtemp(prefix="tokengrad-rwc-")) / "run")
    cmd = [sys.executable, __file__, "--write", run_dir] + ([f"--grace={grace}"] if grace is not None else [])
    writer = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    while not (Path(run_dir) / "steps").exists():
        time.sleep(0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(reads):
            outcomes[read_once(run_dir)] += 1
        writer.kill()
        writer.wait()
        return len(load_run(run_dir).steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=1000)
    p.add_argument("--smoke", action="store_true", help="10 reads")
    p.add_argument("--grace", type=float, help="seconds merged files stay (default: the writer's)")
    p.add_argument("--write", metavar="RUN_DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:
        write(args.write, args.grace)
        return 0
    reads = 10 if args.smoke else args.reads
    outcomes: Counter = Counter()
    t0, written = time.perf_counter(), 0
    for start in range(0, reads, 100):
        written += read_during_writes(min(100, reads - start), args.grace, outcomes)
    elapsed = time.perf_counter() - t0
    failed = sum(n for k, n in outcomes.items() if k.startswith("failed"))
    wrong = sum(n for k, n in outcomes.items() if k.startswith("wrong"))
    print(f"reads: {reads} in {elapsed:.1f} s while {written} steps were written (compact_every=3)")
    print(f"failed reads: {failed}  wrong reads (missing or duplicate rows): {wrong}  (target 0 and 0)")
    for kind, n in sorted(outcomes.items()):
        if kind != "ok":
            print(f"  {kind}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
