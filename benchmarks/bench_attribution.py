"""Cost of an attribution step against today's exact bucket passes, in forward-pass units.

    python benchmarks/bench_attribution.py                  # Llama 4 x 256, V = 8192, batch 4 x 128
    python benchmarks/bench_attribution.py --quick          # fewer repetitions
    python benchmarks/bench_attribution.py --hidden 512 --layers 8 --vocab 32000
    python benchmarks/bench_attribution.py --smoke          # Llama 1 x 64, V = 256: runs, prints every figure

One micro-batch of a random Llama, every token in the loss. Each figure is a median over repetitions and
divided by the median plain forward of the same batch (no grad). Times are CPU seconds of this process
with one thread by default (--threads), so a machine shared with other work still gives the ratios; on a
GPU, or with --wall, wall-clock seconds (synchronised).

- jvp: `directional_logprobs(method="jvp")` along the gradient (forward-mode AD, SDPA math kernel);
- central_difference: the same by two plain forwards at theta +- h g;
- applied update: the directional pass along the applied AdamW delta (same cost as jvp, plus one
  parameter copy taken before the step);
- bucket passes (today): `bucket_gradients` for K = 4 probability buckets (K backward passes over the
  retained graph) plus accumulating and comparing the K gradient copies (`bucket_shares`);
- entropy attribution (Attribution(entropy=True)): the backward of the mean entropy, the jvp of log pi
  along its gradient and the entropy rows on the pass along delta, against one training pass + one jvp.

Extra peak memory is VmHWM during the operation minus the RSS before it (/proc, Linux), each operation in
a fresh process after a warm-up run of it, next to the parameter bytes (the one buffer the applied-update
attribution keeps). Targets from the issue: <= 2
forward passes of time and at most one extra parameter-sized buffer (issue 25: jvp <= 3.3 and central
difference <= 2.2 forwards, near their bounds of about 3 and 2). Nothing is asserted.
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
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(path))

from measure import SMOKE_HELP, line, reset_peak_rss, run_child, status_kb, use_smoke, verdict  # noqa: E402

from tokengrad.record.attribution.shares import directional_logprobs  # noqa: E402
from tokengrad.record.buckets import analysis as bk  # noqa: E402


def make_model(vocab: int, hidden: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 64, 1),
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).float().eval()


def logprobs(model, ids):
    logits = model(ids).logits[:, :-1].float()  # [N, T, V]
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


def setup(args) -> dict:
    """The model, one training pass (gradients in .grad) and the operations to measure, by name."""
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
    quart = torch.quantile(lp.detach().exp().flatten(), torch.tensor([0.25, 0.5, 0.75])).tolist()
    edges = (0.0, *quart, 1.0)
    idx = bk.bucket_index(lp.detach().exp(), edges)
    in_loss = torch.ones_like(lp, dtype=torch.bool)

    def buckets():  # today's exact passes on the retained graph of a training pass (not timed)
        lp_ = train_pass()
        t = CLOCK()
        g = bk.bucket_gradients(
            lp_, coef, in_loss=in_loss, bucket=idx, n_buckets=len(edges) - 1, params=params
        )
        store = [None] * (len(edges) - 1)
        bk.accumulate(store, g)
        bk.bucket_shares(store, [p.grad for p in params])
        return CLOCK() - t

    return {
        "fwd": fwd,
        "train": train_pass,
        "buckets": buckets,
        "n_par": sum(p.numel() for p in params),
        **entropy_ops(model, ids, grads),
        "jvp": lambda: directional_logprobs(model, recompute, grads, "jvp"),
        "central_difference": lambda: directional_logprobs(model, recompute, grads, "central_difference"),
    }


def scores(model, ids):
    """(log pi, entropy) [N, T] each: what recompute() returns with Attribution(entropy=True)."""
    logits = model(ids).logits[:, :-1].float()  # [N, T, V]
    log_p = torch.log_softmax(logits, -1)
    return log_p.gather(2, ids[:, 1:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def entropy_ops(model, ids, grads: dict) -> dict:
    """Entropy attribution's passes (record/attribution/entropy.py): the backward of the mean entropy, the
    directional pass of log pi along its gradient, and the pass along delta with the entropy rows."""
    from tokengrad.record.attribution.entropy import logprobs_only, packed

    params = [p for p in model.parameters()]
    pair = lambda: scores(model, ids)  # noqa: E731

    def backward_h():
        return torch.autograd.grad(pair()[1].mean(), params)

    grad_h = dict(zip(grads, backward_h()))
    return {
        "entropy_backward": backward_h,
        "entropy_jvp": lambda: directional_logprobs(model, logprobs_only(pair), grad_h, "jvp"),
        "delta_jvp_packed": lambda: directional_logprobs(model, packed(pair, 0), grads, "jvp"),
    }


def entropy_lines(ops: dict, t: dict, reps: int) -> None:
    """The cost of Attribution(entropy=True) over update_share's, in forwards; the issue's bound is one
    more backward (a training pass: forward with graph and backward) and one more jvp."""
    e = {name: timed(ops[name], reps) for name in ("entropy_backward", "entropy_jvp", "delta_jvp_packed")}
    f = t["fwd"]
    rows_extra = e["delta_jvp_packed"] - t["jvp"]
    extra = e["entropy_backward"] + e["entropy_jvp"] + max(rows_extra, 0.0)
    bound = t["train"] + t["jvp"]
    line("entropy: backward of the mean entropy", f"{e['entropy_backward'] / f:.2f} forwards")
    line("entropy: jvp of log pi along grad H", f"{e['entropy_jvp'] / f:.2f} forwards")
    line("entropy: H rows on the pass along delta", f"{rows_extra / f:+.2f} forwards")
    line(
        "entropy attribution extra / (1 backward + 1 jvp)",
        f"{extra / bound:.2f}",
        "<= 1",
        verdict(extra / bound, 1.0),
    )


def child_mb(cli: list[str], op: str) -> float:
    """Extra peak MB of one operation, measured in a fresh interpreter (`--child '"OP"'`)."""
    return run_child(__file__, op, tuple(cli))["mb"]


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
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.vocab, args.hidden, args.layers, args.batch, args.seq = 256, 64, 1, 2, 16
    global CLOCK
    CLOCK = time.perf_counter if args.wall else time.process_time
    torch.set_num_threads(args.threads)
    if args.child:  # one operation's extra peak RSS, in a fresh process, after a warm-up run of it
        ops = setup(args)
        ops["fwd"]()
        op = json.loads(args.child)
        ops[op]()
        print(json.dumps({"mb": peak_mb(ops[op])}))
        return
    use_smoke(args.smoke)
    reps = 1 if args.smoke else 3 if args.quick else 7
    ops = setup(args)
    t = {name: timed(ops[name], reps) for name in ("fwd", "jvp", "central_difference", "train")}
    t["buckets"] = statistics.median(ops["buckets"]() for _ in range(reps))
    par_mb = ops["n_par"] * 4 / 2**20
    cli = [a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--quick", "--wall")]
    mem = {name: child_mb(cli, name) for name in ("fwd", "jvp", "central_difference", "train", "buckets")}
    print(
        f"attribution cost: Llama {args.layers} x {args.hidden}, V = {args.vocab}, "
        f"{ops['n_par'] / 1e6:.1f} M parameters ({par_mb:.0f} MB), batch {args.batch} x {args.seq}; "
        f"medians of {reps}; "
        f"{torch.get_num_threads()} threads, {'wall' if args.wall else 'CPU'} seconds"
    )
    f = t["fwd"]
    line("what", "measured", "target")
    line("plain forward (the unit)", f"{f * 1e3:.0f} ms")
    line("forward + backward of the training pass", f"{t['train'] / f:.2f} forwards")
    line("jvp along g (exact)", f"{t['jvp'] / f:.2f} forwards", "<= 3.3", verdict(t["jvp"] / f, 3.3))
    line(
        "central difference along g",
        f"{t['central_difference'] / f:.2f} forwards",
        "<= 2.2",
        verdict(t["central_difference"] / f, 2.2),
    )
    line("attribution step, jvp: along g + along delta", f"{2 * t['jvp'] / f:.2f} forwards")
    line("bucket passes today (K = 4)", f"{t['buckets'] / f:.2f} forwards")
    line("jvp / bucket passes", f"{t['jvp'] / t['buckets']:.2f}")
    line("peak over the model + grads: plain forward", f"{mem['fwd']:.0f} MB")
    for name in ("jvp", "central_difference"):
        extra = mem[name] - mem["fwd"]
        line(f"  {name}, beyond a forward", f"{extra:.0f} MB", f"<= {par_mb:.0f}", verdict(extra, par_mb))
    line("  bucket passes, beyond a training pass", f"{mem['buckets'] - mem['train']:.0f} MB")
    line("applied-update copy (kept per update)", f"{par_mb:.0f} MB", f"<= {par_mb:.0f}", "meets")
    entropy_lines(ops, t, reps)


if __name__ == "__main__":
    main()
