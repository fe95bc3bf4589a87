"""Build the CPU lab model `lab-add`: a 0.86 M-parameter Llama warm-started on a sloppy-carry teacher.

    python scripts/make_lab_model.py                 # writes tokengrad/assets/lab-add/ (about 3.5 MB)
    python scripts/make_lab_model.py --steps 200 --out /tmp/lab   # a quick look, shipped model untouched

Supervised training (tokengrad.train.sft) on compact 4-digit additions (task `lab_add`, balanced over
carry counts) whose targets come from the sloppy-carry teacher: each carry is forgotten with probability
--drop (0.5). A model that fits the teacher samples the right sum of a problem with c carries with
probability 0.5**c, so its held-out accuracy plateaus well below 1 however long SFT runs; the cosine
schedule anneals the learning rate to zero, so the shipped model sits on that plateau, and GRPO with an
exact-match reward (configs/lab_add_grpo.toml) has both signal (some samples are right) and room.

Fixed seed: the same command rebuilds the same weights on the same torch build (one thread). The SFT
history (held-out greedy and sampled accuracy per evaluation) is written next to the weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from tokengrad.train.lab import ADD_CONFIG, ADD_WORDS, lab_dir, make_lab_model, make_word_tokenizer  # noqa: E402
from tokengrad.train.rollout import evaluate, generate_completions, render_prompt, sampling_kwargs  # noqa: E402
from tokengrad.train.sft import SFTConfig, supervised_train  # noqa: E402
from tokengrad.train.tasks import get_task  # noqa: E402

EVAL_PER_CARRY = 100


def sampled_accuracy(model, tok, task, problems) -> float:
    """Share of temperature-1 samples (one per problem) that are exactly right: the RL signal."""
    comps = generate_completions(model, tok, [render_prompt(tok, p) for p in problems], 1, 8,
                                 sampling_kwargs(1.0, 1.0), task)
    return float(np.mean([task.is_correct(p, t) for p, t in zip(problems, comps.texts)]))


def build(steps: int, batch: int, lr: float, drop: float, seed: int, progress: bool = True):
    """(model, tokenizer, history) of a lab-add model trained for `steps` SFT steps."""
    torch.manual_seed(seed)
    task = get_task("lab_add", digits=4)
    tok = make_word_tokenizer(ADD_WORDS)
    model = make_lab_model(tok, seed, **ADD_CONFIG)
    problems = task.train_problems(steps * batch, seed)
    teacher_rng = np.random.default_rng([seed, 2])
    targets = [task.teacher(p, drop, teacher_rng) for p in problems]
    prompts = [render_prompt(tok, p) for p in problems]
    held_out = task.eval_problems(EVAL_PER_CARRY, seed=10_000)   # a fixed set, apart from every RL seed's

    def examples(step: int) -> list[tuple[str, str]]:
        lo = step * batch
        return list(zip(prompts[lo : lo + batch], targets[lo : lo + batch]))

    def evaluate_now(step: int) -> dict:
        with torch.no_grad():
            greedy = evaluate(model, tok, task, held_out, 8, 1, 256)
            n = sum(k for _, k in greedy.values())
            out = {"greedy": sum(a * k for a, k in greedy.values()) / n,
                   "sampled": sampled_accuracy(model, tok, task, held_out)}
        return out | {f"greedy_c{d}": a for d, (a, _) in greedy.items()}

    cfg = SFTConfig(steps=steps, lr=lr, warmup_steps=min(100, steps // 10), eval_every=max(1, steps // 10),
                    progress=progress)
    history = supervised_train(model, tok, examples, cfg, evaluate=evaluate_now)
    return model, tok, history


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="SFT steps (cosine-annealed to lr 0)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--drop", type=float, default=0.5, help="the teacher's carry-forgetting probability")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: reproducible)")
    ap.add_argument("--out", type=Path, default=lab_dir("lab-add"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok, history = build(args.steps, args.batch, args.lr, args.drop, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    settings = {k: getattr(args, k) for k in ("steps", "batch", "lr", "drop", "seed")}
    (args.out / "sft_history.json").write_text(json.dumps({"settings": settings, "history": history},
                                                          indent=1) + "\n")
    size = sum(p.stat().st_size for p in args.out.iterdir()) / 2**20
    print(f"{args.out}: {size:.1f} MB; held-out greedy accuracy {history[-1]['greedy']:.3f}, "
          f"sampled {history[-1]['sampled']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
