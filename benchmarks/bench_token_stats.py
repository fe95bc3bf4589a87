"""token_stats against a naive full log-softmax: time and extra peak memory on 8x256x49,152 fp32 logits.

    python benchmarks/bench_token_stats.py            # 5 repetitions
    python benchmarks/bench_token_stats.py --quick    # 1 repetition
    python benchmarks/bench_token_stats.py --smoke    # 8x16x512 logits: runs, prints every figure

Also run as the "stats" section of bench_recorder.py. Extra peak memory is measured in a fresh process per
implementation (VmHWM after a reset), so earlier allocations cannot hide it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run as a script from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from measure import SMOKE_HELP, line, reset_peak_rss, run_child, status_kb, use_smoke  # noqa: E402

from tokengrad.record.stats import token_stats  # noqa: E402

N, T, V = 8, 256, 49_152  # sequences, tokens per sequence, SmolLM2 vocabulary (as bench_recorder.py)


def use_smoke_sizes() -> None:
    """8 x 16 x 512 logits (--smoke)."""
    global T, V
    T, V = 16, 512


def naive_token_stats(logits: torch.Tensor, token_ids: torch.Tensor):
    """Reference: a full [N, T, V] log_softmax and its exp, as a straightforward implementation would."""
    logp = torch.log_softmax(logits.float(), -1)  # [N, T, V]
    p = logp.exp()  # [N, T, V]
    entropy = -(p * logp).sum(-1)  # [N, T]
    sum_p2 = (p * p).sum(-1)  # [N, T]
    lp = logp.gather(2, token_ids.unsqueeze(-1)).squeeze(-1)  # [N, T]
    return lp, entropy, sum_p2, (1 - 2 * lp.exp() + sum_p2).clamp_min(0).sqrt()


STATS_IMPLS = {"lean": lambda x, ids: token_stats(x, ids), "naive": naive_token_stats}


def _stats_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, T, V, generator=g).mul_(3.0)  # [N, T, V] 403 MB fp32
    return logits, torch.randint(0, V, (N, T), generator=g)


def bench_token_stats(reps: int) -> dict:
    logits, ids = _stats_inputs()
    out = {}
    for impl, fn in STATS_IMPLS.items():
        fn(logits, ids)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn(logits, ids)
            times.append(time.perf_counter() - t)
        out[f"{impl}_s"] = statistics.median(times)
    del logits
    for impl in STATS_IMPLS:
        out[f"{impl}_extra_mb"] = run_child(__file__, {"impl": impl})["extra_mb"]
    return out


def child_main(spec: dict) -> None:
    if spec.get("smoke"):
        use_smoke_sizes()
    logits, ids = _stats_inputs()
    before = status_kb("VmRSS")
    reset_peak_rss()
    STATS_IMPLS[spec["impl"]](logits, ids)
    print(json.dumps({"extra_mb": (status_kb("VmHWM") - before) / 1024}))


def report_stats(r: dict) -> None:
    print(f"\ntoken_stats on {N}x{T}x{V} fp32 logits ({N * T * V * 4 / 2**20:.0f} MB)")
    for impl in STATS_IMPLS:
        line(f"{impl}: time / extra peak", f"{r[impl + '_s'] * 1e3:.0f} ms / {r[impl + '_extra_mb']:.0f} MB")
    line("lean / naive time", f"{r['lean_s'] / r['naive_s']:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    if use_smoke(args.smoke):
        use_smoke_sizes()
    report_stats(bench_token_stats(1 if args.quick or args.smoke else 5))


if __name__ == "__main__":
    main()
