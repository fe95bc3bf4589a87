"""The benchmarks cannot break silently: every script in benchmarks/ runs in --smoke mode (tiny sizes) and
prints each figure it promises with a finite number. Timings are never checked (they mean nothing at these
sizes and on a shared machine)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> the label of each figure it promises (a line holding the label and a number after it)
FIGURES = {
    "bench_attribution.py": (
        "plain forward (the unit)",
        "forward + backward of the training pass",
        "jvp along g (exact)",
        "central difference along g",
        "attribution step, jvp: along g + along delta",
        "bucket passes today (K = 4)",
        "jvp / bucket passes",
        "jvp, beyond a forward",
        "central_difference, beyond a forward",
        "bucket passes, beyond a training pass",
    ),
    "bench_cli.py": (
        "empty interpreter (python -c pass)",
        "import torch alone",
        "tokengrad --help",
        "tokengrad train --help",
        "train, bad value (lr=-1)",
        "train, misspelt key (stpes=3)",
        "train, unknown rule (weighting=tr-grpo)",
        "train, bad rule parameter",
        "tokengrad dashboard --help",
        "tokengrad export --help",
        "tokengrad inspect --help",
        "tokengrad publish --help",
        "tokengrad doctor --help",
        "tokengrad watch --help",
        "scripts/trl_example.py --help",
    ),
    "bench_dashboard.py": (
        "overview_cold",
        "wordcloud_query",
        "inspector_forensics",
        "page_overview_cold",
        "page_buckets_cold",
        "page_wordclouds_cold",
        "page_inspector_cold",
        "page_evaluation_cold",
        "peak RSS",
    ),
    "bench_live_refresh.py": (
        "RSS after warm-up",
        "RSS at the end",
        "growth after warm-up (total)",
        "slope after warm-up per refresh",
        "slope after warm-up per minute",
    ),
    "bench_damaged.py": ("load_run + steps, s", "doctor, s", "doctor peak RSS, MB", "doctor findings"),
    "bench_doctor.py": (
        "step boundary, no doctor    median ms",
        "step boundary, doctor on    median ms",
        "training-thread cost of the doctor, ms",
        "committed() + halt check, us per call",
        "diagnosis per committed step, s         median",
        "-> alert, s",
    ),
    "bench_read_while_compacting.py": (
        "reads:",
        "failed reads:",
        "wrong reads (missing or duplicate rows):",
    ),
    "bench_recorder.py": (
        "no tokenizer:",
        "byte tokenizer:",
        "tokens_table build only (no Parquet)",
        "lean: time / extra peak",
        "naive: time / extra peak",
        "lean / naive time",
        "extra peak ",
        "ratio instrumented / plain (median of pairs)",
        "ratio counting the writer flush wait",
        "ratio fused instrumented / plain",
        "ratio with token_stats taken out",
        "of which token_stats (inside track)",
        "blocked: recorder calls minus token_stats and the plain clip",
        "writer flush wait after the step",
        "per bucket / one backward",
        "record_grad_norms incl. bucket shares",
    ),
    "bench_bucket.py": (
        "first page, local disk",
        "word cloud, local disk",
        "doctor, local disk",
        "first page, bucket, empty cache",
        "first page, bucket, copy kept",
        "doctor, bucket",
        "ratio first page bucket / local",
    ),
    "bench_scale.py": (
        "all rows ",
        "token_budget=2048",
        "training thread: budget / all rows",
        "Overview (steps, layers, evals + figures)",
        "word cloud (2 vocab queries)",
        "probability histogram (prob_bins)",
    ),
    "bench_sharded.py": (
        "buckets / plain step:",
        "buckets extra peak / gradient shard:",
        "attribution / plain step:",
    ),
    "bench_token_stats.py": ("lean: time / extra peak", "naive: time / extra peak", "lean / naive time"),
    "bench_trainer.py": ("tiny ",),
    "bench_trl_confident.py": (
        "TRL fused head forward + backward",
        "statistics taken again, 100% of tokens confident",
        "statistics taken again, 80% of tokens confident",
        "extra / TRL head",
    ),
    "bench_vs_trl.py": (
        "ours          median step",
        "trl           median step",
        "trl+recorder  median step",
        "ratio ours / trl:",
        "ratio trl+recorder / trl:",
        "ratio trl bucket step / recorded step:",
        "ratio trl bucket step (activations kept) / recorded step:",
        "ours, median wall seconds per phase",
    ),
    "bench_whatif.py": (
        "plain recorded step, median s:",
        "ratio 1 rule, buckets=False / plain:",
        "ratio 3 rules, buckets=False / plain:",
        "ratio 1 rule, 4 buckets / plain:",
        "ratio 3 rules, 4 buckets / plain:",
        "one backward through the retained graph, median s:",
        "backwards per rule, 1 rule, buckets=False:",
        "backwards per rule, 3 rules, buckets=False:",
    ),
    "bench_writer.py": ("no tokenizer:", "byte tokenizer:", "tokens_table build only (no Parquet)"),
}
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\d+|nan|inf)", re.IGNORECASE)


def sections(out: str) -> dict[str, str]:
    """The output of benchmarks/smoke.py cut at its `== NAME ==` lines."""
    parts = re.split(r"^== (bench_\w+\.py) ==$", out, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def missing_figures(script: str, text: str) -> list[str]:
    """Labels of FIGURES[script] not printed with a finite number after them."""
    bad = []
    for label in FIGURES[script]:
        lines = [ln for ln in text.splitlines() if label in ln]
        numbers = [NUMBER.findall(ln.split(label, 1)[1]) for ln in lines]
        if not lines or not all(n and all(math.isfinite(float(x)) for x in n) for n in numbers):
            bad.append(label)
    return bad


def test_every_benchmark_has_a_smoke_mode_and_promised_figures():
    scripts = sorted(p.name for p in BENCH.glob("bench_*.py"))
    assert scripts == sorted(FIGURES), "a benchmark without its figures here (or one listed that is gone)"
    for name in scripts:
        assert '"--smoke"' in (BENCH / name).read_text(), f"{name} has no --smoke mode"


def test_missing_figures_finds_absent_and_nan_values():
    text = "  plain forward (the unit)   2 ms\n  jvp along g (exact)   nan forwards\n"
    bad = missing_figures("bench_attribution.py", text)
    assert "plain forward (the unit)" not in bad
    assert "jvp along g (exact)" in bad and "central difference along g" in bad


@pytest.mark.subprocess
def test_every_benchmark_runs_in_smoke_mode_and_prints_its_figures():
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"], "STREAMLIT_LOGGER_LEVEL": "error"}
    out = subprocess.run(
        [sys.executable, str(BENCH / "smoke.py")], capture_output=True, text=True, env=env, timeout=1500
    )
    got = sections(out.stdout)
    assert sorted(got) == sorted(FIGURES), out.stdout[-3000:] + out.stderr[-3000:]
    failed = [name for name, text in got.items() if f"== {name}: ok in" not in text]
    assert not failed and out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    missing = {name: missing_figures(name, text) for name, text in got.items()}
    assert not any(missing.values()), missing
    unread = {}  # the targets table (benchmarks/targets.py) finds each of its figures in the same outputs
    for target in _targets().TARGETS:
        try:
            target.smoke_read(got[target.args[0]].splitlines()) if target.smoke_read else target.read(
                got[target.args[0]].splitlines()
            )
        except (LookupError, IndexError) as e:
            unread[target.key] = str(e)
    assert not unread, unread


def _targets():
    sys.path.insert(0, str(BENCH))
    import targets

    return targets


def test_targets_table_reads_each_figure_from_its_line():
    t = _targets()
    cli_out = [
        "fresh interpreter per run, 1 run(s) each; median wall s / median CPU s; target <= 1.0 s",
        "  import torch alone                                        5.90 / 1.79     reference  ",
        "  tokengrad --help                                          0.13 / 0.04      <= 1.0 s  meets",
        "  train, bad value (lr=-1)                                  1.63 / 0.25      <= 1.0 s  MISSES",
    ]
    assert t.cli(cli_out) == ("max 1.63 wall (train, bad value (lr=-1)), max 0.25 CPU", False)
    rec = [
        "[tiny] step time",
        "  ratio instrumented / plain (median of pairs)   2.705   <= 1.01  MISSES",
        "[smollm2] step time",
        "  ratio instrumented / plain (median of pairs)   1.004   <= 1.01  meets",
        "  ratio fused instrumented / plain               0.998   <= 1.00  meets",
    ]
    assert t.recorder_ratios("[smollm2] step time")(rec) == ("1.004 / 0.998", True)
    with pytest.raises(LookupError, match="fused"):
        t.recorder_ratios("[tiny] step time")(rec[:2])
    with pytest.raises(LookupError, match="no section"):
        t.numbers_after(rec, "ratio", "[huge] step time")
    assert t.upto("training thread: budget / all rows", 2.0, "x")(
        ["  training thread: budget / all rows  2.5x"]
    ) == (
        "2.5x",
        False,
    )


@pytest.mark.subprocess
def test_targets_command_prints_the_table():
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
    cmd = [sys.executable, str(BENCH / "targets.py"), "--smoke", "--only", "cli"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| ")]
    assert rows[0].startswith("| figure | target | measured | met |") and len(rows) == 2, out.stdout
    assert re.search(r"\| max \d+\.\d\d wall \(.+\), max \d+\.\d\d CPU \| (yes|no) \|", rows[1]), rows[1]
