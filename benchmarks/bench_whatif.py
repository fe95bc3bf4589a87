"""The cost of what-if updates (buckets/whatif.py): a recorded step with WhatIf for 1 and 3 rules against the
same recorded step without, on a small Llama in fp32 on the CPU.

    python benchmarks/bench_whatif.py            # 4-layer Llama (hidden 256), 16 x 64 tokens, 7 timed steps
    python benchmarks/bench_whatif.py --smoke    # tiny sizes, a few seconds (timings mean nothing)

Each step is forward, st.track, the GRPO loss, st.backward and st.record_grad_norms (no optimizer step, so
every step runs at the same parameters); the variants run interleaved, so machine load hits them alike, and
the figure is the median of per-round ratios, and the extra time per rule in units of one backward through the
retained graph (the issue's bound: one backward per rule). `buckets=False` costs one backward per rule; with
buckets one backward per probability bucket holding tokens, per rule (Lopti: per phase); here the random
model's tokens all fall in p < 0.25, so the bucket variants make one pass per rule as well.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run as a script from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_attribution import make_model  # noqa: E402
from measure import SMOKE_HELP  # noqa: E402

from tokengrad.objective.loss import policy_loss  # noqa: E402
from tokengrad.record import Recorder, WhatIf  # noqa: E402

ONE, THREE = ["tr_grpo"], ["tr_grpo", "ar", "cw_grpo"]
VARIANTS = {
    "plain": None,
    "1 rule, buckets=False": WhatIf(rules=ONE, every=1, buckets=False),
    "3 rules, buckets=False": WhatIf(rules=THREE, every=1, buckets=False),
    "1 rule, 4 buckets": WhatIf(rules=ONE, every=1),
    "3 rules, 4 buckets": WhatIf(rules=THREE, every=1),
}


def step(model, rec, i: int, ids: torch.Tensor, adv: torch.Tensor) -> float:
    """One recorded step's wall seconds."""
    t = time.perf_counter()
    with rec.step(i) as st:
        logits = model(ids).logits[:, :-1]  # [N, T, V]
        lp = torch.log_softmax(logits.float(), -1).gather(2, ids[:, 1:, None]).squeeze(-1)  # [N, T]
        old = lp.detach()
        st.track(lp, token_ids=ids[:, 1:], old_logprobs=old, advantages=adv, logits=logits)
        st.backward(policy_loss(lp, old, adv, torch.ones_like(lp)).loss)
        st.record_grad_norms()
        model.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def one_backward(model, ids: torch.Tensor) -> float:
    """Wall seconds of one backward through a retained graph of the step's log-probs (the unit a what-if
    rule costs: record/buckets/whatif.py makes one such pass per rule with buckets=False)."""
    logits = model(ids).logits[:, :-1]  # [N, T, V]
    lp = torch.log_softmax(logits.float(), -1).gather(2, ids[:, 1:, None]).squeeze(-1)  # [N, T]
    params = [p for p in model.parameters() if p.requires_grad]
    t = time.perf_counter()
    torch.autograd.grad(lp, params, grad_outputs=torch.ones_like(lp))
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = ap.parse_args(argv)
    hidden, layers, n, t, steps = (32, 1, 4, 8, 2) if args.smoke else (256, 4, 16, 64, args.steps)
    model = make_model(512, hidden, layers)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512, (n, t + 1), generator=g)
    adv = torch.randn(n, generator=g)
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        recs = {
            k: Recorder(Path(tmp) / f"r{j}", model=model, whatif=w)
            for j, (k, w) in enumerate(VARIANTS.items())
        }
        for rec in recs.values():
            rec.open()
        unit = []
        for i in range(steps + 1):  # step 0 warms up
            for k, rec in recs.items():
                dt = step(model, rec, i, ids, adv)
                if i:
                    times[k].append(dt)
            unit.append(one_backward(model, ids))
        for rec in recs.values():
            rec.close()
    print(f"[whatif] Llama hidden {hidden} x {layers} layers, {n} x {t} tokens, {steps} timed steps")
    plain = times["plain"]
    print(f"plain recorded step, median s: {statistics.median(plain):.4f}")
    bwd = statistics.median(unit[1:])
    print(f"one backward through the retained graph, median s: {bwd:.4f}")
    for k in list(VARIANTS)[1:]:
        ratio = statistics.median(a / b for a, b in zip(times[k], plain))
        print(f"ratio {k} / plain: {ratio:.3f}")
    for k, r in (("1 rule, buckets=False", 1), ("3 rules, buckets=False", 3)):
        extra = (statistics.median(times[k]) - statistics.median(plain)) / (r * bwd)
        print(f"backwards per rule, {k}: {extra:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
