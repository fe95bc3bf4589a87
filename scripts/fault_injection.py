"""Kill a real tiny `tokengrad train` run with SIGKILL at random points, resume it each time, and check that
every step the run has completed is read exactly once.

    python scripts/fault_injection.py                       # 10 kills, seed 0
    python scripts/fault_injection.py --kills 30 --seed 4 --slow-writer 0.3 --keep runs/fi

Each attempt resumes the run (or starts it, while it has no meta.json) and is stopped in one of three
ways, drawn at random:
  * timer: SIGKILL at a random moment after the attempt's first new step reached disk;
  * point: SIGKILL at the k-th pass through a fault point of tokengrad.faults (a commit, a Parquet write, a
    merge, the removal of the small files it covers after their grace period, the two renames of a
    checkpoint save, a finished checkpoint);
  * term: SIGTERM at a random moment; the process must exit 143 with its rank status written, meta.json
    unfinished and its claim on the run directory released.
Attempts train a few steps past the checkpoint, so processes also end normally and compact their files,
and kills land in that compaction too (a run killed after its last step is finished by the next resume).
A SIGKILL leaves the run's claim (ranks/rank000.lock) behind: the next attempt must break it as stale.
While each attempt runs, a reader reads the run in a loop: every read must succeed and hold each step once.
`--slow-writer S` makes every commit wait S seconds (a slow disk).

After every attempt the run on disk is checked: each step up to the checkpoint's is in the steps table
exactly once, and no token row (step, pass_id, sample_id, position) or sample row is read twice. At the end
the run is completed and every step 0..steps-1 must be read exactly once. Prints the counts; exit 1 on any
violation.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokengrad import faults, load_run  # noqa: E402
from tokengrad.train.checkpoint import TRAINER_FILE, checkpoint_path  # noqa: E402

CONFIG = """model = "tiny"
task = "arithmetic"
prompts_per_step = 2
group_size = 2
max_new_tokens = 8
bf16 = false
progress = false
eval_every = 2
eval_per_difficulty = 1
checkpoint_every = 1
"""
POINTS = ("commit", "write", "compacted", "unlinked", "checkpoint_renamed", "checkpoint_saved")
SAMPLES_PER_STEP = 4  # prompts_per_step x group_size
DUP_TOKENS = "SELECT count(*) - count(DISTINCT (step, pass_id, sample_id, position)) AS d FROM tokens"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs to inflict (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill schedule (default 0)")
    p.add_argument("--steps", type=int, default=12, help="steps of the finished run (default 12)")
    p.add_argument(
        "--slow-writer",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds every commit waits, as on a slow disk (default 0)",
    )
    p.add_argument("--keep", metavar="DIR", help="keep the run in DIR (default: a temporary folder)")
    return p.parse_args(argv)


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's checkpoint, read the way --resume reads it (None: none yet)."""
    from tokengrad.train.checkpoint import has_checkpoint, load_trainer_state

    if not has_checkpoint(run_dir):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(load_trainer_state(run_dir)["step"])


def check(run_dir: Path, complete_to: int | None) -> tuple[int, list[str]]:
    """(steps checked, violations): steps 0..complete_to each read exactly once, no row read twice."""
    if not (run_dir / "meta.json").exists():
        lost = f"meta.json is missing but a checkpoint is at step {complete_to}"
        return 0, [] if complete_to is None else [lost]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = load_run(run_dir)
        steps = run.steps["step"].tolist()
        dup_tokens = run.sql(DUP_TOKENS)["d"][0]
        samples = run.samples.groupby("step").size()
    problems = []
    if len(steps) != len(set(steps)):
        problems.append(f"steps read twice: {sorted({s for s in steps if steps.count(s) > 1})}")
    if dup_tokens:
        problems.append(f"{dup_tokens} token rows read twice")
    if (samples > SAMPLES_PER_STEP).any():
        problems.append(f"samples read twice at steps {samples[samples > SAMPLES_PER_STEP].index.tolist()}")
    if run.warnings:
        problems.append(f"reader warnings: {run.warnings}")
    if complete_to is None:
        return 0, problems
    missing = sorted(set(range(complete_to + 1)) - set(steps))
    if missing:
        problems.append(f"steps {missing} are missing although the checkpoint is at step {complete_to}")
    short = [s for s in range(complete_to + 1) if samples.get(s, 0) != SAMPLES_PER_STEP]
    if short:
        problems.append(f"steps {short} do not hold {SAMPLES_PER_STEP} samples")
    return complete_to + 1, problems


class Reader(threading.Thread):
    """Reads the run in a loop while an attempt writes it: counts reads, failed reads and reads that held
    a step twice or a gap before the last step."""

    def __init__(self, run_dir: Path):
        super().__init__(daemon=True)
        self.run_dir, self.stop = run_dir, threading.Event()
        self.reads, self.failed, self.wrong = 0, [], 0

    def run(self) -> None:
        while not self.stop.is_set():
            if not (self.run_dir / "meta.json").exists():
                time.sleep(0.05)
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run = load_run(self.run_dir)
                    steps = run.steps["step"].tolist()
                    dup = run.sql(DUP_TOKENS)
            except Exception as err:  # noqa: BLE001 - every failure is reported
                self.failed.append(f"{type(err).__name__}: {err}"[:200])
                continue
            self.reads += 1
            self.wrong += len(steps) != len(set(steps)) or bool(dup["d"][0])


def new_steps(run_dir: Path) -> int:
    """Committed files of the steps table (a cheap progress signal while a process runs)."""
    return len(list((run_dir / "steps").rglob("s*.parquet")))


class Attempts:
    def __init__(self, args: argparse.Namespace, run_dir: Path, config: Path):
        self.args, self.run_dir, self.config = args, run_dir, config
        self.rng = random.Random(args.seed)
        self.step_time = 3.0  # seconds per step, refined from what the attempts show
        self.reads = 0  # reads made while attempts wrote the run

    def command(self, steps: int) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "tokengrad.cli",
            "train",
            str(self.config),
            f"run_dir={self.run_dir}",
            f"steps={steps}",
        ]
        return cmd + ["--resume"] * (self.run_dir / "meta.json").exists()

    def env(self, spec: str | None) -> dict:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        parts = [spec] if spec else []
        if self.args.slow_writer:
            parts.append(f"commit:sleep={self.args.slow_writer}")
        env.pop(faults.ENV, None)
        if parts:
            env[faults.ENV] = ",".join(parts)
        return env

    def run(self, steps: int, mode: str) -> tuple[int, str, list[str]]:
        """One attempt; returns (return code, what was done, violations seen while it ran)."""
        spec = None
        if mode == "point":
            spec = f"{self.rng.choice(POINTS)}:kill@{self.rng.randint(1, 3)}"
        proc = subprocess.Popen(
            self.command(steps),
            env=self.env(spec),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        reader = Reader(self.run_dir)
        reader.start()
        if mode in ("timer", "term"):
            self.kill_later(proc, signal.SIGTERM if mode == "term" else signal.SIGKILL)
        err = proc.communicate()[1]
        reader.stop.set()
        reader.join()
        self.reads += reader.reads
        if proc.returncode not in (0, -signal.SIGKILL, 143):
            raise SystemExit(f"the training process failed (exit {proc.returncode}):\n{err[-3000:]}")
        problems = [f"read failed while the run was written: {e}" for e in reader.failed[:3]]
        problems += [f"{reader.wrong} reads held a row twice"] * bool(reader.wrong)
        if proc.returncode == 143:
            problems += self.check_terminated(err)
        return proc.returncode, spec or mode, problems

    def check_terminated(self, err: str) -> list[str]:
        """What a SIGTERM must leave: one exit line, the rank status, meta.json unfinished, no claim."""
        problems = []
        if "Traceback" in err or "stopped by SIGTERM" not in err:
            problems.append(f"SIGTERM exit was not one line: {err[-300:]!r}")
        if not (self.run_dir / "ranks" / "rank000.json").exists():
            problems.append("SIGTERM left no rank status")
        if (self.run_dir / "ranks" / "rank000.lock").exists():
            problems.append("SIGTERM left the run's claim behind")
        return problems

    def kill_later(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        """`sig` at a random moment after this attempt's first new step file appears."""
        start = new_steps(self.run_dir)
        while proc.poll() is None and new_steps(self.run_dir) == start:
            time.sleep(0.05)
        t0 = time.time()
        delay = self.rng.uniform(0, 2.5 * self.step_time)
        while proc.poll() is None and time.time() - t0 < delay:
            time.sleep(0.02)
        if proc.poll() is None:
            done = new_steps(self.run_dir) - start
            if done > 1:
                self.step_time = 0.5 * self.step_time + 0.5 * (time.time() - t0) / (done - 1)
            proc.send_signal(sig)
            proc.wait()


def main(argv=None) -> int:
    args = parse_args(argv)
    tmp = None if args.keep else tempfile.mkdtemp(prefix="tokengrad-fi-")
    base = Path(args.keep or tmp)
    base.mkdir(parents=True, exist_ok=True)
    run_dir, config = base / "run", base / "tiny.toml"
    shutil.rmtree(run_dir, ignore_errors=True)
    config.write_text(CONFIG)
    attempts = Attempts(args, run_dir, config)
    kills = violations = checked = n = 0
    print(
        f"fault injection: {args.kills} kills, seed {args.seed}, {args.steps} steps, run in {run_dir}",
        flush=True,
    )
    while kills < args.kills:
        n += 1
        ckpt = checkpoint_step(run_dir)
        first = 0 if ckpt is None else ckpt + 1
        if first >= args.steps - 1:  # far enough: start the run over to keep killing real training
            shutil.rmtree(run_dir)
            ckpt, first = None, 0
        steps = min(args.steps - 1, first + attempts.rng.randint(1, 4))
        mode = attempts.rng.choice(("timer", "point", "term"))
        rc, what, seen = attempts.run(steps, mode)
        kills += rc in (-signal.SIGKILL, 143)
        ckpt_after = checkpoint_step(run_dir)
        got, problems = check(run_dir, ckpt_after)
        problems = seen + problems
        checked += got
        violations += len(problems)
        outcome = {0: "ended", 143: "terminated"}.get(rc, "killed")
        print(
            f"[{kills}/{args.kills}] attempt {n}: steps {first}..{steps - 1}, {what}: {outcome}; "
            f"checkpoint at {ckpt_after}; {got} steps checked"
            + "".join(f"\n    VIOLATION {p}" for p in problems),
            flush=True,
        )
    rc, _, seen = attempts.run(args.steps, "none")
    got, problems = check(run_dir, args.steps - 1)
    problems = seen + problems
    checked += got
    violations += len(problems)
    if (checkpoint_path(run_dir) / TRAINER_FILE).exists() and not problems:
        print(f"final run: steps 0..{args.steps - 1} each read exactly once", flush=True)
    for p in problems:
        print(f"    VIOLATION {p}", flush=True)
    print(
        f"kills: {kills}  attempts: {n + 1}  violations: {violations}  steps checked: {checked}  "
        f"reads while writing: {attempts.reads}"
    )
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
