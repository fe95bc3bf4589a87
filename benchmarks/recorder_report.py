"""The report of bench_recorder.py: its sizes and targets, and one aligned line per measured figure."""

from __future__ import annotations

from measure import line, verdict

V = 49_152  # SmolLM2 vocabulary, the size the memory target is stated at
N, T, G = 8, 256, 4  # sequences, scored tokens per sequence, group size
EPS_LOW, EPS_HIGH = 0.2, 0.28  # asymmetric PPO clip (DAPO-style)
TARGETS = {
    "step_ratio": 1.01,
    "fused_ratio": 1.00,
    "extra_peak_mb": 64.0,
    "blocked_ms": 5.0,
    "writer_rows_s": 1e6,
}
BUCKET_STEP_GB = {"tiny": 2, "smollm2": 12}  # rough RAM a bucket step needs (graph kept + bucket grads)
MODEL_NOTES = {  # read the step ratio in the light of how much of the step is the [N, T, V] softmax
    "tiny": "hidden 32, 2 layers: the step is almost all LM-head softmax, the worst case for token_stats",
    "smollm2": "SmolLM2-135M-Instruct, fp32, 30 layers",
}


def report_steps(name: str, r: dict) -> None:
    print(f"\n[{name}] step time, default mode, batch {N}x{T}, V={V} (medians of interleaved pairs)")
    print(f"  ({MODEL_NOTES[name]})")
    line("plain step", f"{r['plain'] * 1e3:.1f} ms")
    line("instrumented step", f"{r['instr'] * 1e3:.1f} ms")
    line(
        "ratio instrumented / plain (median of pairs)",
        f"{r['ratio']:.3f}",
        f"<= {TARGETS['step_ratio']}",
        verdict(r["ratio"], TARGETS["step_ratio"]),
    )
    line("  ratio counting the writer flush wait", f"{r['ratio_flush']:.3f}")
    line("fused instrumented step (logprobs_with_stats)", f"{r['fused'] * 1e3:.1f} ms")
    line(
        "ratio fused instrumented / plain",
        f"{r['ratio_fused']:.3f}",
        f"<= {TARGETS['fused_ratio']:.2f}",
        verdict(r["ratio_fused"], TARGETS["fused_ratio"]),
    )
    line("  ratio with token_stats taken out", f"{r['ratio_wo_stats']:.3f}")
    line("recorder calls per step (track+norms+clip+log+end)", f"{r['record_calls'] * 1e3:.2f} ms")
    line("  of which token_stats (inside track)", f"{r['token_stats'] * 1e3:.2f} ms")
    line(
        "  track / grad_norms+clip / log / end_step",
        " / ".join(f"{r[k] * 1e3:.2f}" for k in ("track", "grad_norms", "log", "end_step")) + " ms",
    )
    line("  the plain step's clip_grad_norm_", f"{r['plain_clip'] * 1e3:.2f} ms")
    line(
        "blocked: recorder calls minus token_stats and the plain clip",
        f"{r['blocked'] * 1e3:.2f} ms",
        f"<= {TARGETS['blocked_ms']:.0f} ms",
        verdict(r["blocked"] * 1e3, TARGETS["blocked_ms"]),
    )
    line("writer flush wait after the step (background)", f"{r['flush_wait'] * 1e3:.2f} ms")


def report_memory(name: str, m: dict) -> None:
    note = "" if m["reset"] else " (VmHWM not reset: includes step 0)"
    print(f"\n[{name}] peak RSS of one step, fresh process per mode{note}")
    line("plain", f"{m['plain_mb']:.0f} MB")
    line("instrumented", f"{m['instr_mb']:.0f} MB")
    line(
        "extra peak",
        f"{m['extra_mb']:+.1f} MB",
        f"<= {TARGETS['extra_peak_mb']:.0f} MB",
        verdict(m["extra_mb"], TARGETS["extra_peak_mb"]),
    )


def report_buckets(name: str, r: dict) -> None:
    print(f"\n[{name}] bucket analysis (bucket_every > 0 steps only)")
    line("plain backward", f"{r['backward'] * 1e3:.1f} ms")
    line(f"analyze_buckets, {r['nonempty']} non-empty buckets", f"{r['analyze'] * 1e3:.1f} ms")
    line("per bucket / one backward", f"{r['per_bucket']:.2f}")
    line("record_grad_norms incl. bucket shares", f"{r['shares'] * 1e3:.1f} ms")
