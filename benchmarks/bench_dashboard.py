"""Dashboard speed benchmark on a synthetic 10 M-token run.

    python benchmarks/bench_dashboard.py                     # 10 M token rows, 500 steps, in a temp dir
    python benchmarks/bench_dashboard.py --rows 2e6 --keep runs/bench
    python benchmarks/bench_dashboard.py --smoke              # 2,000 rows: runs, prints every figure

Writes a run in the tokengrad layout (schema.py: RUN/meta.json, RUN/{table}/rank000/s*.parquet) with
pyarrow directly, vectorised with numpy, then times the data-layer calls each dashboard page makes on a
cold cache and prints them against the targets: Overview cold load <= 2 s, word-cloud query <= 1 s; then
the dashboard's pages through Streamlit's AppTest with --runs copies of the run under the root (default 4:
the first page cold with 4 runs, target <= 2 s).
No call reads the tokens table whole: token queries aggregate inside DuckDB.

The run is written by tests/synthetic_runs.py (shared with the dashboard tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from synthetic_runs import write_synthetic_run  # noqa: E402

from tokengrad import schema  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from measure import SMOKE_HELP  # noqa: E402

# measure -> target seconds; every one is judged in the verdict (page_overview_cold: issue 25, the first page
# cold through AppTest with --runs runs)
TARGETS_S = {"overview_cold": 2.0, "wordcloud_query": 1.0, "page_overview_cold": 2.0}


# ---- benchmark ---------------------------------------------------------------------------------------
def _timed(label: str, fn, results: dict) -> object:
    """Wall seconds into results[label], CPU seconds of all threads into results[label + " cpu"]."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    results[label] = time.perf_counter() - t0
    results[label + " cpu"] = time.process_time() - c0
    return out


def _clear_caches() -> None:
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()


def bench_data_layer(run: Path) -> dict[str, float]:
    """Cold timings of the data-layer calls the pages make (each cache cleared first)."""
    from tokengrad.app import data
    from tokengrad.figures.curves import make_overview_figure
    from tokengrad.figures.gradnorms import make_grad_norm_figure
    from tokengrad.figures.summary import summarize_run

    r, res = str(run), {}
    _clear_caches()

    def overview():
        steps, layers, evals = (data.table(r, t) for t in ("steps", "layers", "evals"))
        summarize_run(run.name, data.meta(r), steps, layers=layers, evals=evals)
        make_overview_figure({run.name: steps})
        make_grad_norm_figure({run.name: layers})

    _timed("overview_cold", overview, res)
    _timed("overview_warm", overview, res)
    _clear_caches()
    _timed(
        "wordcloud_query",
        lambda: (
            data.query(
                r, "token_frequencies", prob_lo=0.75, prob_hi=1.0, step_range=None, adv_sign=None, limit=480
            ),
            data.query(
                r, "token_frequencies", prob_lo=0.0, prob_hi=0.25, step_range=None, adv_sign=None, limit=480
            ),
        ),
        res,
    )
    _timed(
        "wordcloud_query_filtered",
        lambda: data.query(
            r, "token_frequencies", prob_lo=0.75, prob_hi=1.0, step_range=(100, 300), adv_sign=1, limit=480
        ),
        res,
    )
    _timed(
        "buckets_grad_vs_prob+histogram",
        lambda: data.query(r, "grad_norm_by_prob", bins=20, step_range=None),
        res,
    )
    steps = _timed("inspector_token_steps", lambda: data.query(r, "token_steps"), res)
    step = steps[len(steps) // 2]
    _timed(
        "inspector_forensics",
        lambda: (
            data.query(r, "top_samples", step=step, k=10, value="logit_grad_norm"),
            data.query(r, "top_tokens", step=step, k=20, value="logit_grad_norm"),
        ),
        res,
    )
    _timed("inspector_completion", lambda: data.query(r, "sample_tokens", step=step, sample_id=3), res)
    return res


def bench_pages(root: Path) -> dict[str, float]:
    """Wall time of each page through Streamlit's AppTest, on a cold cache (first visit of the page)."""
    from streamlit.testing.v1 import AppTest

    os.environ["TOKENGRAD_RUNS_ROOT"] = str(root)
    _clear_caches()
    res = {}
    at = _timed(
        "page_overview_cold",
        lambda: AppTest.from_file(
            str(ROOT / "tokengrad" / "app" / "streamlit_app.py"), default_timeout=120
        ).run(),
        res,
    )
    for page in ("buckets", "wordclouds", "inspector", "evaluation"):
        _timed(f"page_{page}_cold", lambda: at.switch_page(f"views/{page}.py").run(), res)
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].value}")
    return res


def _report(results: dict[str, float]) -> None:
    """One line per measure: wall and CPU seconds (all threads; on a busy machine wall >> CPU / cores)."""
    print(f"{'measure':32s} {'wall s':>7s} {'cpu s':>7s} {'target':>7s} {'ratio':>6s}")
    for name, sec in results.items():
        if name.endswith(" cpu"):
            continue
        target = TARGETS_S.get(name)
        extra = f"{target:7.1f} {sec / target:6.2f}" if target else ""
        print(f"{name:32s} {sec:7.3f} {results[name + ' cpu']:7.3f} {extra}")


def _miss(results: dict[str, float], name: str, cpu: bool) -> str:
    """'page_overview_cold 2.77 s > 2.0 s' (a figure's label is always followed by its value)."""
    return f"{name} {results[name + (' cpu' if cpu else '')]:.2f} s > {TARGETS_S[name]:.1f} s"


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=float, default=10e6, help="token rows (default 1e7)")
    p.add_argument("--steps", type=int, default=500, help="training steps (default 500)")
    p.add_argument("--samples", type=int, default=64, help="completions per step (default 64)")
    p.add_argument("--keep", default=None, help="write the run here and keep it (default: a temp dir)")
    p.add_argument(
        "--runs", type=int, default=4, help="runs under the root the pages see (copies; default 4)"
    )
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.steps, args.samples = 2000, 10, 4
    os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")  # bare-mode cache warnings, once per call
    n_tok = max(1, round(args.rows / (args.steps * args.samples)))
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tokengrad_bench_"))
    run = root / "bench"
    try:
        if not (run / schema.META_FILE).exists():
            t0 = time.perf_counter()
            write_synthetic_run(
                run,
                n_steps=args.steps,
                n_samples=args.samples,
                n_tok=n_tok,
                bucket_every=10,
                eval_every=50,
                n_layers=24,
            )
            print(
                f"wrote {args.steps * args.samples * n_tok:,} token rows in {time.perf_counter() - t0:.1f} s"
            )
        for k in range(1, args.runs):  # the other runs the first page lists and loads
            if not (root / f"bench{k}").exists():
                shutil.copytree(run, root / f"bench{k}")
        rss0 = _peak_rss_mb()
        results = {**bench_data_layer(run), **bench_pages(root)}
        _report(results)
        print(
            f"peak RSS {_peak_rss_mb():.0f} MB (before the page calls {rss0:.0f} MB); "
            f"the tokens table alone would take ~{args.rows * 100 / 2**20:.0f} MB in pandas"
        )
        # Wall time on a CPU-bound call is at most its CPU time (summed over threads) unless other
        # processes take the cores; on a loaded machine judge by CPU time and say so.
        load, cpus = os.getloadavg()[0], os.cpu_count() or 1
        busy = load > cpus
        missed = [k for k, v in TARGETS_S.items() if results[k + (" cpu" if busy else "")] > v]
        ok = not missed
        print(
            f"load average {load:.1f} on {cpus} CPUs: targets judged on {'CPU' if busy else 'wall'} time: "
            + (
                "all targets met"
                if ok
                else "TARGET MISSED: " + ", ".join(_miss(results, k, busy) for k in missed)
            )
        )
        return 0 if ok or args.smoke else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
