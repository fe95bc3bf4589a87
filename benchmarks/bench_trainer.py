"""Time per trainer step, split into generation / scoring / update / recording, from the run it records.

    python benchmarks/bench_trainer.py                       # tiny random model, a few seconds
    python benchmarks/bench_trainer.py --smollm              # also SmolLM2-135M-Instruct
                                                             # (about a minute on 2 cores)
    python benchmarks/bench_trainer.py --smollm --weighting lopti --prompts 2 --group 4
    python benchmarks/bench_trainer.py --smoke               # 1 timed step of 1 x 2 x 4 tokens: every column

Columns (seconds per step, mean over the timed steps; the first step is a warm-up and is not timed):
generate = sampling the completions, score = rewards + advantages + the no-grad log pi_old (and log pi_ref)
pass (log pi_old is skipped when the first loss pass is on-policy: `reuse_old_logprobs`, docs/trainer.md),
update = forward/backward/optimizer of every update (record is the part of it spent in the recorder),
step = the whole step as the recorder saw it. gen tok/s counts completion tokens only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run as a script from a checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from measure import SMOKE_HELP  # noqa: E402

from tokengrad import load_run  # noqa: E402
from tokengrad.train.config import make_config  # noqa: E402
from tokengrad.train.trainer import Trainer  # noqa: E402

COLUMNS = ("time_generate", "time_score", "time_update", "time_record", "time_step")


def bench(model: str, args: argparse.Namespace, max_new_tokens: int, root: Path) -> dict:
    cfg = make_config(
        dict(
            model=model,
            task=args.task,
            weighting=args.weighting,
            steps=args.steps + 1,
            prompts_per_step=args.prompts,
            group_size=args.group,
            max_new_tokens=max_new_tokens,
            bf16=args.bf16,
            lr=1e-6,
            progress=False,
            checkpoint=False,
            bucket_every=args.bucket_every,
            run_dir=str(root / model),
        )
    )
    Trainer(cfg).setup().train()
    steps = load_run(root / model).steps.iloc[1:]  # step 0 is the warm-up
    row = {c: float(steps[c].mean()) for c in COLUMNS}
    n_tokens = steps["completion_len"] * args.prompts * args.group
    row["gen_tok_s"] = float((n_tokens / steps["time_generate"]).mean())
    row["len"] = float(steps["completion_len"].mean())
    return row


def print_table(rows: dict[str, dict], args: argparse.Namespace) -> None:
    print(
        f"\ntask={args.task} weighting={args.weighting} B={args.prompts} G={args.group} "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}; seconds per step, mean of {args.steps} steps\n"
    )
    head = (
        f"{'model':<24}{'generate':>10}{'score':>10}{'update':>10}{'record':>10}"
        f"{'step':>10}{'gen tok/s':>11}{'len':>7}"
    )
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        print(
            f"{name:<24}{r['time_generate']:>10.3f}{r['time_score']:>10.3f}{r['time_update']:>10.3f}"
            f"{r['time_record']:>10.3f}{r['time_step']:>10.3f}{r['gen_tok_s']:>11.1f}{r['len']:>7.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smollm", action="store_true", help="also time SmolLM2-135M-Instruct")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--weighting", default="grpo")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    parser.add_argument("--prompts", type=int, default=2, help="B prompts per step")
    parser.add_argument("--group", type=int, default=4, help="G completions per prompt")
    parser.add_argument("--tiny-tokens", type=int, default=32, help="max_new_tokens for the tiny model")
    parser.add_argument("--smollm-tokens", type=int, default=64, help="max_new_tokens for SmolLM2")
    parser.add_argument("--bucket-every", type=int, default=0, help="bucket analysis every N steps (0 = off)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (config key bf16)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0 = torch's default); on a machine shared with other jobs 1 is often fastest",
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.prompts, args.group, args.tiny_tokens, args.smollm = 1, 1, 2, 4, False
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows["tiny"] = bench("tiny", args, args.tiny_tokens, Path(tmp))
        if args.smollm:
            rows["smollm2-135m-instruct"] = bench(
                "smollm2-135m-instruct", args, args.smollm_tokens, Path(tmp)
            )
    print_table(rows, args)


if __name__ == "__main__":
    main()
