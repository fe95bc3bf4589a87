"""The K&K lab organism's measurements: GRPO runs summarised, and the SFT-continuation control.

    python scripts/lab_kk_check.py summary /tmp/kk_seed0 /tmp/kk_seed1        # one row per run
    python scripts/lab_kk_check.py control --seed 0 --seconds 900 --out /tmp/kk_control0.json

summary: held-out greedy accuracy by people count at the first evaluation (step -1) and the last, mean
seconds per step, the share of live steps (a non-zero gradient), sampled reward at the start and end,
and the share of sampled checks that say ok after a written contradiction (lab_kk.overlook_share).
control: continues lab-kk's own SFT (the sloppy teacher of its sft_history.json, the config's RL learning
rate, prompts x group sequences per step) for `seconds` of wall time, on the config's training people
counts, and evaluates the config's held-out set before and after (the RL runs' yardstick).
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

from tokengrad import load_run  # noqa: E402
from tokengrad.train.config import load_config  # noqa: E402
from tokengrad.train.lab import lab_dir  # noqa: E402
from tokengrad.train.tasks.lab_kk import overlook_share  # noqa: E402

CONFIG = ROOT / "configs" / "lab_kk_grpo.toml"


def by_people(evals, step) -> dict:
    e = evals[evals["step"] == step]
    acc = {str(d): round(float(a), 3) for d, a in zip(e["difficulty"], e["accuracy"])}
    return acc | {"all": round(float((e["accuracy"] * e["n"]).sum() / e["n"].sum()), 3)}


def summarise(run_dir: str) -> dict:
    run = load_run(run_dir)
    ev, steps = run.evals, run.steps
    first, last = steps.iloc[: max(1, len(steps) // 10)], steps.iloc[-max(1, len(steps) // 10) :]
    return {
        "run": run_dir,
        "steps": len(steps),
        "start": by_people(ev, ev["step"].min()),
        "end": by_people(ev, ev["step"].max()),
        "live_share": round(float((steps["grad_norm"] > 0).mean()), 3),
        "s_per_step": round(float(steps["time_step"].mean()), 2),
        # first / last 10 % of steps: sampled accuracy, completion length, entropy
        "sampled": [round(float(x["accuracy"].mean()), 3) for x in (first, last)],
        "completion_len": [round(float(x["completion_len"].mean()), 1) for x in (first, last)],
        "entropy": [round(float(x["entropy_mean"].mean()), 3) for x in (first, last)],
        # share of the sampled checks that say ok after writing a contradiction (the teacher's q = 0.6)
        "overlooked": [round(overlooked(run.samples, x["step"]), 3) for x in (first, last)],
    }


def overlooked(samples, steps) -> float:
    """lab_kk.overlook_share of the sampled completions of these steps (NaN without a contradiction)."""
    return overlook_share(samples.loc[samples["step"].isin(set(steps)), "completion"])[0]


def print_summaries(args) -> None:
    for run in args.runs:
        print(json.dumps(summarise(run)))


def run_control(args) -> None:
    torch.set_num_threads(args.threads)
    print(json.dumps(control(args.seed, args.seconds, args.out)))


def control(seed: int, seconds: float, out: Path) -> dict:
    """SFT continuation of lab-kk for `seconds`; held-out accuracy by people count before and after."""
    from tokengrad.train.generation import evaluate, render_prompt
    from tokengrad.train.models import load_model
    from tokengrad.train.sft import SFTConfig, supervised_train
    from tokengrad.train.tasks import get_task

    cfg = load_config(CONFIG, {"seed": seed})
    drop = json.loads((lab_dir("lab-kk") / "sft_history.json").read_text())["settings"]["drop"]
    torch.manual_seed(seed)
    model, tok = load_model(cfg.model, seed=seed)
    task = get_task(cfg.task, **cfg.task_params)
    held = task.eval_problems(cfg.eval_per_difficulty, seed)
    batch = cfg.prompts_per_step * cfg.group_size
    problems = task.train_problems(batch * 2000, seed)
    rng = np.random.default_rng([seed, 3])
    pairs = [(render_prompt(tok, p), task.teacher(p, drop, rng)) for p in problems]

    def examples(step: int) -> list[tuple[str, str]]:
        return [pairs[(step * batch + j) % len(pairs)] for j in range(batch)]

    def held_out(step: int) -> dict:
        res = evaluate(
            model,
            tok,
            task,
            problems=held,
            max_new_tokens=cfg.eval_max_new_tokens or cfg.max_new_tokens,
            max_turns=1,
            batch_size=150,
        )
        n = sum(k for _, k in res.values())
        return {"all": sum(a * k for a, k in res.values()) / n} | {d: a for d, (a, _) in res.items()}

    start = held_out(-1)
    sft = SFTConfig(
        steps=10**6, lr=cfg.lr, min_lr=cfg.lr, warmup_steps=0, max_seconds=seconds, progress=False
    )
    end = supervised_train(model, tok, examples, sft, evaluate=held_out)[-1]
    row = {"seed": seed, "seconds": seconds, "sft_steps": end["step"] + 1, "start": start, "end": end}
    out.write_text(json.dumps(row) + "\n")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary")
    s.add_argument("runs", nargs="+")
    s.set_defaults(func=print_summaries)
    c = sub.add_parser("control")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--seconds", type=float, default=900)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--threads", type=int, default=1)
    c.set_defaults(func=run_control)
    args = ap.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
