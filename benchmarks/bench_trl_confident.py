"""Cost of the exact confident-token statistics in the TRL integration, against TRL's own fused LM head.

    python benchmarks/bench_trl_confident.py            # 3 repetitions
    python benchmarks/bench_trl_confident.py --quick    # 1 repetition
    python benchmarks/bench_trl_confident.py --smoke    # 32 tokens, head 64 x 512: runs, prints every figure

TRL's loss pass runs its fused head (forward with log-probs, entropy and log sum p^2, then backward) over the
micro-batch's completion tokens. The recording takes the logits of the tokens with p > 1/2 again from the
LM-head input (tokengrad/integrations/trl/fused.py). Printed: both times on SmolLM2-135M's head
(D = 576, V = 49,152) for 512 tokens, with every token confident (the worst case) and with 80 % of them,
and the ratio of the extra work to TRL's head.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run as a script from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from measure import SMOKE_HELP, line  # noqa: E402

from tokengrad.integrations.trl.fused import Captured, _confident_stats  # noqa: E402

M, D, V = 512, 576, 49_152  # tokens of a micro-batch, SmolLM2-135M hidden size and vocabulary


def trl_head(hidden, head, ids):
    """TRL's fused head on the rows, forward with the three outputs the recording asks for, then backward."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    h = hidden.detach().requires_grad_(True)
    lp, ent, _, _, _ = ChunkedLogProbFunction.apply(
        h,
        head.weight,
        head.bias,
        ids,
        1.0,
        _CHUNKED_LOGPROB_CHUNK_SIZE,
        None,
        1.0,
        ("log_probs", "entropy", "log_sum_sq_probs"),
    )
    lp.sum().backward()


def median_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    global M, D, V
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args(argv)
    if a.smoke:
        M, D, V = 32, 64, 512
    reps = 1 if a.quick or a.smoke else 3
    torch.manual_seed(0)
    head = torch.nn.Linear(D, V, bias=False)
    hidden = torch.randn(M, D)
    ids = torch.randint(0, V, (M,))
    captured = Captured(sum_p2=None, hidden=hidden[None], head=head, temperature=1.0)
    weight = head.weight.detach()
    trl_head(hidden, head, ids)  # warm-up: the first call imports and prepares TRL's kernel
    t_trl = median_seconds(lambda: trl_head(hidden, head, ids), reps)
    print(f"\nexact confident-token statistics, {M} tokens, head {D} x {V} (median of {reps})")
    line("TRL fused head forward + backward", f"{t_trl * 1e3:.0f} ms")
    for share in (1.0, 0.8):
        k = int(share * M)
        t = median_seconds(lambda: _confident_stats(captured, weight, hidden[:k], ids[:k]), reps)
        line(f"statistics taken again, {share:.0%} of tokens confident", f"{t * 1e3:.0f} ms")
        line("  extra / TRL head", f"{t / t_trl:.2f}")


if __name__ == "__main__":
    main()
