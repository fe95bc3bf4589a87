"""The performance targets table, measured by one command: each figure read from its benchmark's output.

    python benchmarks/targets.py                    # every target at measuring size (~30 min, 2 cores)
    python benchmarks/targets.py --only cli,budget  # some of them
    python benchmarks/targets.py --only costs       # the costs a user feels (issue 38): trl_bucket,
                                                    # trl_bucket_kept, trainer, blocked (bench_vs_trl.py
                                                    # on SmolLM2, bench_recorder.py; ~12 min on 2 cores)
    python benchmarks/targets.py --smoke            # tiny sizes: the table can be made (figures meaningless)
    python benchmarks/targets.py --log-dir DIR      # also keep each benchmark's full output in DIR

Each benchmark runs as it would from its command line, in a fresh interpreter, one after another; this
script only reads the line each figure is printed on (`label` after the `section` header) and prints the
markdown table benchmarks/README.md carries, headed by the date, the machine and its load average (the
figures are timings on a shared machine: read them with the load). Nothing is asserted about the values.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\d+)")
# the interpreter-start noise the CLI figures are compared against is not a target
CLI_SKIP = ("empty interpreter", "import torch alone")
BLOCKED = "blocked: recorder calls minus token_stats and the plain clip"
# issue 38: the costs a user feels, in one run (bench_vs_trl.py once for the first three: ~12 min, 2 cores)
GROUPS = {"costs": ("trl_bucket", "trl_bucket_kept", "trainer", "blocked")}
VS_TRL = ("bench_vs_trl.py", "--bucket-activations")  # SmolLM2-135M-Instruct
VS_TRL_SMOKE = ("bench_vs_trl.py", "--smoke")  # --smoke times every variant
BUCKET = ("bench_bucket.py",)  # a run standing for 1 B token rows, local and on moto's S3 server
BUCKET_SMOKE = ("bench_bucket.py", "--smoke")


@dataclass(frozen=True)
class Target:
    key: str
    figure: str  # the wording of the figure
    target: str
    args: tuple[str, ...]  # the benchmark and its arguments at measuring size
    smoke_args: tuple[str, ...]
    read: Callable[[list[str]], tuple[str, bool]]  # output lines -> (measured text, met)
    smoke_read: Callable[[list[str]], tuple[str, bool]] | None = None  # where --smoke prints elsewhere


def numbers_after(lines: list[str], label: str, section: str = "") -> list[float]:
    """The numbers on the first line holding `label` after the first line starting with `section`."""
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith(section)), None) if section else 0
    if start is None:
        raise LookupError(f"no section {section!r} in the output")
    for ln in lines[start:]:
        if label in ln:
            return [float(x) for x in NUMBER.findall(ln.split(label, 1)[1])]
    raise LookupError(f"no line {label!r} in the output" + (f" after {section!r}" if section else ""))


def upto(label: str, limit: float, unit: str = "", section: str = "", index: int = 0):
    """A reader: the index-th number after `label`, met when <= limit."""

    def read(lines: list[str]) -> tuple[str, bool]:
        value = numbers_after(lines, label, section)[index]
        return f"{value:.3g}{unit}", value <= limit

    return read


def whatif_ratios(lines: list[str]) -> tuple[str, bool]:
    """bench_whatif.py's step ratios for 1 and 3 rules, met when each rule costs at most ~one backward."""
    one = numbers_after(lines, "ratio 1 rule, buckets=False / plain:")[0]
    three = numbers_after(lines, "ratio 3 rules, buckets=False / plain:")[0]
    rules = ("1 rule, buckets=False", "3 rules, buckets=False")
    per = [numbers_after(lines, f"backwards per rule, {k}:")[0] for k in rules]
    return f"{one:.2f} / {three:.2f} ({per[0]:.2f} / {per[1]:.2f} backwards per rule)", max(per) <= 1.1


def recorder_ratios(section: str):
    """The instrumented and fused step ratios of one model section of bench_recorder.py."""

    def read(lines: list[str]) -> tuple[str, bool]:
        plain = numbers_after(lines, "ratio instrumented / plain (median of pairs)", section)[0]
        fused = numbers_after(lines, "ratio fused instrumented / plain", section)[0]
        return f"{plain:.3f} / {fused:.3f}", plain <= 1.01 and fused <= 1.00

    return read


def attribution(lines: list[str]) -> tuple[str, bool]:
    jvp = numbers_after(lines, "jvp along g (exact)")[0]
    cd = numbers_after(lines, "central difference along g")[0]
    return f"{jvp:.2f} / {cd:.2f} forwards (CPU s)", jvp <= 3.3 and cd <= 2.2


def sharded(section: str):
    """bench_sharded.py on one (wrapper, processes) section: buckets=4 step against its bound of
    1 + K * backward / step, and its extra peak memory in gradient shards (<= 2)."""

    def read(lines: list[str]) -> tuple[str, bool]:
        ratio, bound = numbers_after(lines, "buckets / plain step:", section)[:2]
        extra = numbers_after(lines, "buckets extra peak / gradient shard:", section)[0]
        return f"{ratio:.2f} step (bound {bound:.2f}), {extra:.2f} shards", ratio <= bound and extra <= 2

    return read


def trainer_vs_trl(lines: list[str]) -> tuple[str, bool]:
    cpu, wall = numbers_after(lines, "ratio ours / trl:")[:2]
    return f"{cpu:.2f} CPU ({wall:.2f} wall)", cpu <= 0.75


def trl_bucket_kept(lines: list[str]) -> tuple[str, bool]:
    cpu, wall = numbers_after(lines, "ratio trl bucket step (activations kept) / recorded step:")[:2]
    return f"{cpu:.2f} CPU ({wall:.2f} wall)", cpu <= 1.5


def trl_bucket_step(lines: list[str]) -> tuple[str, bool]:
    cpu, wall = numbers_after(lines, "ratio trl bucket step / recorded step:")[:2]
    return f"{cpu:.2f} CPU ({wall:.2f} wall)", cpu <= 1.5


def cli(lines: list[str]) -> tuple[str, bool]:
    """The slowest command in wall and in CPU seconds (each line: wall s / CPU s)."""
    rows = [
        ln for ln in lines if ln.startswith("  ") and "<= 1.0 s" in ln and not any(s in ln for s in CLI_SKIP)
    ]
    if not rows:
        raise LookupError("no command lines in bench_cli.py's output")
    pairs = [(ln.split("  ")[1].strip() or ln.strip(), NUMBER.findall(ln.split("<=")[0])[-2:]) for ln in rows]
    walls = {name: float(w) for name, (w, _) in pairs}
    cpus = [float(c) for _, (_, c) in pairs]
    worst = max(walls, key=walls.get)
    return f"max {walls[worst]:.2f} wall ({worst}), max {max(cpus):.2f} CPU", max(walls.values()) <= 1.0


def dashboard(lines: list[str]) -> tuple[str, bool]:
    """Judged as bench_dashboard.py judges it: on CPU time when the load exceeded the cores, else wall."""
    wall, cpu = numbers_after(lines, "page_overview_cold")[:2]
    on_cpu = any("targets judged on CPU time" in ln for ln in lines)
    value = cpu if on_cpu else wall
    return f"{wall:.2f} wall, {cpu:.2f} CPU (judged on {'CPU' if on_cpu else 'wall'})", value <= 2.0


def many_files(label: str, limit: float, unit: str):
    """The worst of bench_damaged.py's two runs (5,000 zero-row / invalid step files) on one figure."""

    def read(lines: list[str]) -> tuple[str, bool]:
        values = [
            numbers_after(lines, label, f"[{d}]")[0] for d in ("steps_many_zero_rows", "steps_many_empty")
        ]
        return f"{max(values):.3g}{unit} (zero-row {values[0]:.3g}, invalid {values[1]:.3g})", max(
            values
        ) <= limit

    return read


def _doctor_many(lines: list[str]) -> tuple[str, bool]:
    secs, secs_ok = many_files("doctor, s", 10.0, " s")(lines)
    mb, mb_ok = many_files("doctor peak RSS, MB", 300.0, " MB")(lines)
    return f"{secs} / {mb}", secs_ok and mb_ok


TARGETS = (
    Target(
        "recorder",
        "recorded / plain step, SmolLM2-135M 8x256, `track(logits=)` / `logprobs_with_stats`",
        "<= 1.01 / <= 1.00",
        ("bench_recorder.py", "--smollm", "--no-tiny", "--sections", "steps", "--steps", "5"),
        ("bench_recorder.py", "--smoke"),
        recorder_ratios("[smollm2] step time"),
        recorder_ratios("[tiny] step time"),  # --smoke has no SmolLM2 section
    ),
    Target(
        "blocked",
        "training thread blocked per step beyond the softmax statistics and torch's clip_grad_norm_, "
        "norm shared by `st.clip_grad_norm_` (SmolLM2 step)",
        "<= 5 ms",
        ("bench_recorder.py", "--smollm", "--no-tiny", "--sections", "steps", "--steps", "5"),
        ("bench_recorder.py", "--smoke"),
        upto(BLOCKED, 5.0, " ms", "[smollm2] step time"),
        upto(BLOCKED, 5.0, " ms", "[tiny] step time"),
    ),
    Target(
        "attribution",
        "JVP attribution / central difference, in forwards",
        "<= 3.3 / <= 2.2",
        ("bench_attribution.py", "--quick"),
        ("bench_attribution.py", "--smoke"),
        attribution,
    ),
    Target(
        "whatif",
        "recorded step with WhatIf for 1 / 3 rules (buckets=False) / without, in backwards per rule, "
        "4-layer Llama 16 x 64 on CPU",
        "<= 1.1 backwards per rule",
        ("bench_whatif.py",),
        ("bench_whatif.py", "--smoke"),
        whatif_ratios,
    ),
    Target(
        "budget",
        "budget's training-thread time per 2 M-row step vs recording every row",
        "<= 2x",
        ("bench_scale.py", "--part", "step"),
        ("bench_scale.py", "--smoke", "--part", "step"),
        upto("training thread: budget / all rows", 2.0, "x"),
    ),
    Target(
        "trainer",
        "built-in trainer step / TRL step, same settings (SmolLM2-135M, 2 x 4, 40 new tokens)",
        "<= 0.75",
        VS_TRL,
        VS_TRL_SMOKE,
        trainer_vs_trl,
    ),
    Target(
        "trl_bucket",
        "TRL step with bucket analysis / recorded step without (SmolLM2-135M, 2 x 4, 40 tokens, buckets=2)",
        "<= 1.5",
        VS_TRL,
        VS_TRL_SMOKE,
        trl_bucket_step,
    ),
    Target(
        "trl_bucket_kept",
        "the same with attach(bucket_activations=True): no gradient checkpointing on bucket steps",
        "<= 1.5",
        VS_TRL,
        VS_TRL_SMOKE,
        trl_bucket_kept,
    ),
    Target(
        "cli",
        "bad config value, `train --help`, any `--help`",
        "<= 1 s",
        ("bench_cli.py", "--reps", "3"),
        ("bench_cli.py", "--smoke"),
        cli,
    ),
    Target(
        "sharded",
        "FSDP2, 2 processes, buckets=4: step / plain (bound 1 + K bwd / step), extra peak in grad shards",
        "<= bound / <= 2",
        ("bench_sharded.py",),
        ("bench_sharded.py", "--smoke"),
        sharded("[fsdp2 x2]"),
    ),
    Target(
        "many_files_load",
        "`load_run` + steps on a run with 5,000 zero-row or invalid files in one table",
        "<= 5 s",
        ("bench_damaged.py",),
        ("bench_damaged.py", "--smoke"),
        many_files("load_run + steps, s", 5.0, " s"),
    ),
    Target(
        "many_files_doctor",
        "the doctor on the same runs: wall time / peak RSS",
        "<= 10 s / <= 300 MB",
        ("bench_damaged.py",),
        ("bench_damaged.py", "--smoke"),
        _doctor_many,
    ),
    Target(
        "dashboard",
        "dashboard first page, cold, 4 runs of 2 M token rows",
        "<= 2 s",
        ("bench_dashboard.py", "--rows", "2e6", "--steps", "100", "--samples", "64"),
        ("bench_dashboard.py", "--smoke"),
        dashboard,
    ),
    Target(
        "scale1b_page",
        "first page of a run standing for 1 B token rows (60 steps, K = 65,536), cold, local disk",
        "<= 2 s",
        BUCKET,
        BUCKET_SMOKE,
        upto("first page, local disk", 2.0, " s"),
    ),
    Target(
        "scale1b_wordcloud",
        "word cloud (2 vocab queries) of that run, cold, local disk",
        "<= 1 s",
        BUCKET,
        BUCKET_SMOKE,
        upto("word cloud, local disk", 1.0, " s"),
    ),
    Target(
        "scale1b_bucket",
        "first page of that run from an S3-compatible server on 127.0.0.1, empty cache",
        "<= 5 s",
        BUCKET,
        BUCKET_SMOKE,
        upto("first page, bucket, empty cache", 5.0, " s"),
    ),
    Target(
        "scale1b_doctor",
        "`tokengrad doctor` on that run (the bucket's local copy)",
        "<= 10 s",
        BUCKET,
        BUCKET_SMOKE,
        upto("doctor, bucket", 10.0, " s"),
    ),
)


def run_benchmark(args: tuple[str, ...], log_dir: Path | None) -> tuple[list[str], float]:
    """A benchmark's output lines (stdout and stderr) and its wall seconds; a failure raises with its tail."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(HERE / args[0]), *args[1:]], capture_output=True, text=True, cwd=HERE.parent
    )
    text = out.stdout + out.stderr
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / ("_".join(a.strip("-") for a in args) + ".log")).write_text(text)
    if out.returncode not in (0, 1):  # 1: a benchmark that says a target was missed
        raise RuntimeError(f"{' '.join(args)} failed (exit {out.returncode}):\n{text[-3000:]}")
    return text.splitlines(), time.perf_counter() - t0


def header() -> str:
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    cpu = platform.processor() or platform.machine()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{when}, {os.cpu_count()} CPUs ({cpu}), no GPU, load average {load} (1/5/15 min)"


def measure(targets: list[Target], smoke: bool, log_dir: Path | None) -> list[tuple[Target, str, str]]:
    """(target, measured text, met) per target; each distinct command runs once."""
    outputs: dict[tuple[str, ...], list[str]] = {}
    rows = []
    for t in targets:
        args = t.smoke_args if smoke else t.args
        if args not in outputs:
            print(f"[targets] python benchmarks/{' '.join(args)}", file=sys.stderr, flush=True)
            outputs[args], secs = run_benchmark(args, log_dir)
            print(f"[targets]   done in {secs:.0f} s", file=sys.stderr, flush=True)
        try:
            read = t.smoke_read if smoke and t.smoke_read else t.read
            measured, met = read(outputs[args])
            rows.append((t, measured, "yes" if met else "no"))
        except (LookupError, IndexError) as e:
            rows.append((t, f"not read: {e}", "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only",
        default="",
        help=f"comma list of {', '.join(t.key for t in TARGETS)}, or a group: {', '.join(GROUPS)}",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="every benchmark at tiny sizes (figures meaningless)"
    )
    ap.add_argument("--log-dir", type=Path, default=None, help="keep each benchmark's output here")
    args = ap.parse_args(argv)
    keys = [k for part in args.only.split(",") if part for k in GROUPS.get(part, (part,))]
    unknown = sorted(set(keys) - {t.key for t in TARGETS})
    if unknown:
        ap.error(f"unknown target(s) {unknown}; known: {', '.join(t.key for t in TARGETS)}")
    chosen = [t for t in TARGETS if not keys or t.key in keys]
    start = header()
    rows = measure(chosen, args.smoke, args.log_dir)
    print(f"Measured {start} -> load {'/'.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print("by `python benchmarks/targets.py" + (" --smoke" if args.smoke else "") + "`:\n")
    print("| figure | target | measured | met | command |")
    print("|---|---|---|---|---|")
    for t, measured, met in rows:
        command = " ".join(t.smoke_args if args.smoke else t.args)
        print(f"| {t.figure} | {t.target} | {measured} | {met} | `{command}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
