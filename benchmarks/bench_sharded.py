"""Cost of the gradient half under FSDP2 and DDP: step time and peak memory per rank, plain vs buckets=4 vs
attribution, at 1, 2 and 4 processes (torchrun, gloo on CPU), printed as ratios measured in one run.

    python benchmarks/bench_sharded.py                 # Llama 4 x 128, V = 4096, 8 x 64 tokens per rank
    python benchmarks/bench_sharded.py --worlds 1,2    # fewer launches
    python benchmarks/bench_sharded.py --smoke         # Llama 1 x 32, 1 and 2 processes: every figure printed

Each (wrapper, processes) pair is one torchrun launch; each rank runs the three variants in turn on the same
batches (a warm-up step, then --steps timed steps each): no analysis (`Recorder(buckets=0)`), the bucket
analysis with K = 4 populated buckets every step (edges at the quartiles of the first batch's probabilities,
so every bucket has a pass), and attribution every step (jvp under DDP, central differences at perturbed
shards under FSDP2). Rank 0 prints, per pair:

- step time of each variant over the plain step, and the target for buckets=4 of 1 + K * backward / step
  (at most K extra backward passes; the backward measured inside the plain step);
- extra peak memory of the variant (VmHWM during its steps minus the RSS before them, /proc, Linux) over the
  size of this rank's gradient shard (fp32), target <= 2 for the buckets (the saved g and the residual).

Times are medians of wall seconds; on a shared machine read the ratios. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
K = 4


def launch(wrap: str, world: int, args) -> dict:
    """One torchrun launch of this script's rank part; rank 0's JSON line."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world)]
    cmd += [__file__, "--rank-part", wrap, "--steps", str(args.steps), "--size", args.size]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{wrap} x{world} failed:\n{out.stderr[-3000:]}")
    return json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])


SIZES = {
    "measure": dict(hidden=128, layers=4, vocab=4096, rows=8, tokens=64),
    "smoke": dict(hidden=32, layers=1, vocab=256, rows=2, tokens=8),
}


def rank_part(wrap: str, steps: int, size: str) -> None:
    """On every rank: the three variants, timed; rank 0 prints one JSON line."""
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(HERE))
    from measure import reset_peak_rss, status_kb
    from sharded_example import WRAPS

    from tokengrad import Recorder
    from tokengrad.record.buckets.sharded import local_shard
    from tokengrad.record.options import Attribution, Buckets

    torch.distributed.init_process_group("gloo")
    s, rank = SIZES[size], torch.distributed.get_rank()
    cfg = LlamaConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=2 * s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model = WRAPS[wrap](model)
    recorded = getattr(
        model, "module", model
    )  # DDP: the recorder reads the inner model (scripts/ddp_example.py)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, s["vocab"], (s["rows"], s["tokens"] + 1), generator=g)  # [n, T + 1]
    adv = torch.randn(s["rows"], generator=g)  # [n]

    def logprobs():
        logits = model(ids).logits[:, :-1]  # [n, T, V]
        return torch.log_softmax(logits.float(), -1).gather(2, ids[:, 1:, None]).squeeze(-1)  # [n, T]

    with torch.no_grad():
        q = torch.quantile(logprobs().exp().flatten(), torch.tensor([0.25, 0.5, 0.75])).tolist()
    variants = {
        "plain": {},
        "buckets": dict(buckets=Buckets(1, (0.0, *q, 1.0))),
        "attribution": dict(attribution=Attribution(1)),
    }
    out = {}
    for name, opts in variants.items():
        times, backward = [], []
        with Recorder(tempfile.mkdtemp() + "/run", model=recorded, **opts) as rec:
            for step in range(steps + 1):
                if step == 1:
                    reset_peak_rss()
                    rss = status_kb("VmRSS")
                t0 = time.perf_counter()
                with rec.step(step) as st:
                    lp = logprobs()
                    st.track(
                        lp,
                        token_ids=ids[:, 1:],
                        advantages=adv,
                        sample_ids=torch.arange(s["rows"]) + rank * s["rows"],
                        recompute=logprobs,
                    )
                    tb = time.perf_counter()
                    st.backward(-(lp * adv[:, None]).mean())
                    backward.append(time.perf_counter() - tb)
                    st.clip_grad_norm_(1.0)
                    opt.step()
                    opt.zero_grad()
                times.append(time.perf_counter() - t0)
        peak = status_kb("VmHWM") - rss
        out[name] = dict(
            step=statistics.median(times[1:]), backward=statistics.median(backward[1:]), extra_kb=peak
        )
    shard = sum(local_shard(p).numel() for p in model.parameters()) * 4 / 1024  # fp32 gradient shard, KiB
    out["shard_kb"] = shard
    torch.distributed.barrier()
    if rank == 0:
        print(json.dumps(out), flush=True)
    os._exit(0)  # FSDP's background threads can abort the interpreter's teardown


def report(wrap: str, world: int, r: dict) -> None:
    plain = r["plain"]["step"]
    bound = 1 + K * r["plain"]["backward"] / plain
    bwd, shard = r["plain"]["backward"] * 1e3, r["shard_kb"] / 1024
    head = f"[{wrap} x{world}] plain step {plain * 1e3:.1f} ms, backward {bwd:.1f} ms"
    print(f"{head}, gradient shard {shard:.2f} MiB")
    for name in ("buckets", "attribution"):
        ratio = r[name]["step"] / plain
        extra = r[name]["extra_kb"] / r["shard_kb"]
        target = f"target <= {bound:.2f}" if name == "buckets" else ""
        print(f"  {name} / plain step: {ratio:.2f} {target}")
        print(
            f"  {name} extra peak / gradient shard: {extra:.2f}"
            + (" target <= 2" if name == "buckets" else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--wraps", default="fsdp2,ddp")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--size", default="measure", choices=sorted(SIZES))
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 and 2 processes, one timed step")
    ap.add_argument("--rank-part", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_part:
        return rank_part(args.rank_part, args.steps, args.size)
    if args.smoke:
        args.worlds, args.steps, args.size = "1,2", 1, "smoke"
    for wrap in args.wraps.split(","):
        for world in [int(w) for w in args.worlds.split(",")]:
            report(wrap, world, launch(wrap, world, args))


if __name__ == "__main__":
    main()
