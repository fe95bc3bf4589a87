"""Cost of an attribution step against today's exact bucket passes, in forward-pass units.

    python benchmarks/bench_attribution.py                  # Llama 4 x 256, V = 8192, batch 4 x 128
    python benchmarks/bench_attribution.py --quick          # fewer repetitions
    python benchmarks/bench_attribution.py --hidden 512 --layers 8 --vocab 32000

One micro-batch of a random Llama, every token in the loss. Each figure is a median over repetitions and
divided by the median plain forward of the same batch (no grad). Times are CPU seconds of this process
with one thread by default (--threads), so a machine shared with other work still gives the ratios; on a
GPU, or with --wall, wall-clock seconds (synchronised).

- jvp: `directional_logprobs(method="jvp")` along the gradient (forward-mode AD, SDPA math kernel);
- central_difference: the same by two plain forwards at theta +- h g;
- applied update: the directional pass along the applied AdamW delta (same cost as jvp, plus one
  parameter copy taken before the step);
- bucket passes (today): `bucket_gradients` for K = 4 probability buckets (K backward passes over the
  retained graph) plus accumulating and comparing the K gradient copies (`bucket_shares`).

Extra peak memory is VmHWM during the operation minus the RSS before it (/proc, Linux), next to the
parameter bytes (the one buffer the applied-update attribution keeps). Targets from the issue: <= 2
forward passes of time and at most one extra parameter-sized buffer. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from measure import line, reset_peak_rss, status_kb, verdict  # noqa: E402

from tokengrad.record import bucket_analysis as bk  # noqa: E402
from tokengrad.record.attribution import directional_logprobs  # noqa: E402


def make_model(vocab: int, hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
                      num_key_value_heads=max(hidden // 64, 1), max_position_embeddings=1024,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).float().eval()


def logprobs(model, ids):
    logits = model(ids).logits[:, :-1].float()                                    # [N, T, V]
    return logits.gather(2, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)  # [N, T]


CLOCK = time.process_time  # --wall switches to time.perf_counter


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = CLOCK()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(CLOCK() - t)
    return statistics.median(out)


def peak_mb(fn) -> float:
    """Extra peak RSS of fn() over the RSS before it, MB (NaN where /proc refuses the reset)."""
    before = status_kb("VmRSS")
    if not reset_peak_rss():
        fn()
        return float("nan")
    fn()
    return (status_kb("VmHWM") - before) / 1024


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall-clock instead of CPU seconds")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.perf_counter if args.wall else time.process_time
    torch.set_num_threads(args.threads)
    reps = 3 if args.quick else 7
    model = make_model(args.vocab, args.hidden, args.layers)
    params = [p for p in model.parameters()]
    ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1))
    adv = torch.randn(args.batch, 1)

    def fwd():
        with torch.no_grad():
            logprobs(model, ids)

    def train_pass():
        model.zero_grad(set_to_none=True)
        lp = logprobs(model, ids)
        (-(lp * adv).mean()).backward(retain_graph=True)
        return lp

    lp = train_pass()
    coef = torch.autograd.grad(-(lp * adv).mean(), lp, retain_graph=True)[0]
    grads = {n: p.grad for n, p in model.named_parameters()}
    recompute = lambda: logprobs(model, ids)  # noqa: E731
    edges = tuple(float(q) for q in [0.0, *torch.quantile(lp.detach().exp().flatten(),
                                                           torch.tensor([0.25, 0.5, 0.75])).tolist(), 1.0])
    idx = bk.bucket_index(lp.detach().exp(), edges)
    in_loss = torch.ones_like(lp, dtype=torch.bool)

    def buckets():
        lp_ = train_pass()
        t = CLOCK()
        g = bk.bucket_gradients(lp_, coef, in_loss, idx, len(edges) - 1, params)
        store = [None] * (len(edges) - 1)
        bk.accumulate(store, g)
        bk.bucket_shares(store, [p.grad for p in params])
        return CLOCK() - t

    t_fwd = timed(fwd, reps)
    t_jvp = timed(lambda: directional_logprobs(model, recompute, grads, "jvp"), reps)
    t_cd = timed(lambda: directional_logprobs(model, recompute, grads, "central_difference"), reps)
    t_bk = statistics.median(buckets() for _ in range(reps))
    t_train = timed(train_pass, reps)
    n_par = sum(p.numel() for p in params)
    par_mb = n_par * 4 / 2**20
    m_fwd = peak_mb(fwd)
    m_jvp = peak_mb(lambda: directional_logprobs(model, recompute, grads, "jvp"))
    m_cd = peak_mb(lambda: directional_logprobs(model, recompute, grads, "central_difference"))

    def bucket_mem():
        lp_ = train_pass()
        g = bk.bucket_gradients(lp_, coef, in_loss, idx, len(edges) - 1, params)
        del g

    m_bk = peak_mb(bucket_mem) - peak_mb(lambda: train_pass())
    print(f"attribution cost: Llama {args.layers} x {args.hidden}, V = {args.vocab}, {n_par / 1e6:.1f} M "
          f"parameters ({par_mb:.0f} MB), batch {args.batch} x {args.seq}; medians of {reps}; "
          f"{torch.get_num_threads()} threads, {'wall' if args.wall else 'CPU'} seconds")
    line("what", "measured", "target")
    line("plain forward (the unit)", f"{t_fwd * 1e3:.0f} ms")
    line("forward + backward of the training pass", f"{t_train / t_fwd:.2f} forwards")
    line("jvp along g (exact)", f"{t_jvp / t_fwd:.2f} forwards", "<= 2", verdict(t_jvp / t_fwd, 2.0))
    line("central difference along g", f"{t_cd / t_fwd:.2f} forwards", "<= 2", verdict(t_cd / t_fwd, 2.0))
    line("attribution step, jvp: along g + along delta", f"{2 * t_jvp / t_fwd:.2f} forwards")
    line(f"bucket passes today (K = {len(edges) - 1})", f"{t_bk / t_fwd:.2f} forwards")
    line("jvp vs bucket passes", f"{t_jvp / t_bk:.2f} x")
    line("extra peak: plain forward", f"{m_fwd:.0f} MB")
    line("extra peak: jvp", f"{m_jvp:.0f} MB", f"fwd + {par_mb:.0f}", verdict(m_jvp, m_fwd + par_mb))
    line("extra peak: central difference", f"{m_cd:.0f} MB", f"fwd + {par_mb:.0f}",
         verdict(m_cd, m_fwd + par_mb))
    line("extra peak: bucket passes (K grads)", f"{m_bk:.0f} MB")
    line("applied-update copy (kept per update)", f"{par_mb:.0f} MB", f"<= {par_mb:.0f}", "meets")


if __name__ == "__main__":
    main()
