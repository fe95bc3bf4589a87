"""Build a CPU lab model: `lab-add` (default) or `lab-kk`, a small Llama warm-started on a sloppy teacher.

    python scripts/make_lab_model.py                 # writes tokengrad/assets/lab-add/ (about 3.5 MB)
    python scripts/make_lab_model.py --organism kk   # writes tokengrad/assets/lab-kk/ (see ORGANISMS)
    python scripts/make_lab_model.py --steps 200 --out /tmp/lab   # a quick look, shipped model untouched

Supervised training (tokengrad.train.sft) on compact 4-digit additions (task `lab_add`, balanced over
carry counts) whose targets come from the sloppy-carry teacher: each carry is forgotten with probability
--drop (0.6). A model that fits the teacher writes each carry with probability 0.4, so it samples the right
sum of a problem with c carries with probability 0.4**c and its greedy answer drops every carry: SFT
plateaus at partial competence however long it runs. One cosine cycle (1,600 steps of 128, peak lr 2e-3)
anneals the learning rate to zero on that plateau (held-out sampled exact match 0.30-0.32 over the last
half), so GRPO with an exact-match reward (configs/lab_add_grpo.toml) has both signal (some samples are
right) and room (the greedy answer is right only without carries). About 17 minutes on one thread.

`--organism kk`: K&K with a plain-word reasoning trace (task `lab_kk`, 2-4 people) that checks every
person's statement claim by claim; the teacher writes every claim and truth right and overlooks each
contradiction with probability --drop (tokengrad.train.tasks.lab_kk). 1,500 steps of 32 at peak lr 2e-3,
about 27 minutes on one thread: the model writes the claims and truths (teacher-forced: 100 % of claim
truths, 97 % of statement truths, 90-95 % of roles) and, like the teacher, most often says ok after a
contradiction, so greedy decoding accepts the first try (held-out greedy 0.30 / 0.10 / 0.10 at 2 / 3 / 4
people); sampling is right 0.41 / 0.14 / 0.09 of the time (the teacher: 0.44 / 0.28 / 0.19).

A phase may name its own teacher: `--phases 600:2e-3:0,300:1e-3:0.6` trains first on a faithful teacher
(error probability 0), then settles on the sloppy one; `--task-params '{"n_people": [2, 3]}'` changes the
task's settings (here the puzzle sizes) for a probe.

Fixed seed: the same command rebuilds the same weights on the same torch build (one thread). The SFT
history (held-out greedy and sampled accuracy per evaluation) is written next to the weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from transformers import AutoModelForCausalLM  # noqa: E402

from tokengrad.train.generation import evaluate, generate_completions, render_prompt, sampling_kwargs  # noqa: E402
from tokengrad.train.lab import (  # noqa: E402
    ADD_CONFIG,
    ADD_WORDS,
    KK_CONFIG,
    KK_WORDS,
    lab_dir,
    make_lab_model,
    make_word_tokenizer,
    set_generation_ids,
)
from tokengrad.train.sft import SFTConfig, supervised_train  # noqa: E402
from tokengrad.train.tasks import get_task  # noqa: E402

EVAL_PER_CARRY = 100
PHASES = "1600:2e-3"  # the shipped model: one cosine cycle, annealed to lr 0 on the teacher's plateau


@dataclass(frozen=True)
class Organism:
    """What differs between lab models: task, vocabulary, architecture and the SFT defaults."""

    model: str  # the registered model name, also the assets folder
    task: str
    task_params: dict
    words: tuple[str, ...]
    config: dict  # LlamaConfig fields
    phases: str  # default --phases
    batch: int  # default --batch
    drop: float  # default --drop: the teacher's error probability
    eval_per: int = EVAL_PER_CARRY  # held-out problems per difficulty in the SFT history
    max_new_tokens: int = 8  # generation budget of the history's evaluations
    level_key: str = "greedy_c"  # history key prefix of greedy accuracy per difficulty
    eval_batch: int = 256
    evals: int = 10  # held-out evaluations per SFT phase
    # reorders the problem stream (problems, batch) -> problems; batches of one length save padding
    order: Callable[[list, int], list] = lambda problems, batch: problems


def by_size_within(problems: list, batch: int, window: int = 8) -> list:
    """Each run of `window` batches stably sorted by difficulty, so a batch mostly holds one puzzle size
    (4-person traces are ~4x as long as 2-person ones: mixed batches are mostly padding) while the mix
    of sizes over `window` steps stays that of the stream."""
    span = batch * window
    return [p for lo in range(0, len(problems), span) for p in sorted(problems[lo : lo + span], key=_size)]


def _size(problem) -> int:
    return int(problem.difficulty)


ORGANISMS = {
    "add": Organism("lab-add", "lab_add", {"digits": 4}, ADD_WORDS, ADD_CONFIG, PHASES, 128, 0.6),
    # 2-4 people (5-person traces run to ~270 tokens); see tokengrad/train/tasks/lab_kk.py for the teacher
    "kk": Organism(
        "lab-kk",
        "lab_kk",
        {"n_people": (2, 4)},
        KK_WORDS,
        KK_CONFIG,
        "1500:2e-3",
        32,
        0.6,
        eval_per=50,
        max_new_tokens=768,
        level_key="greedy_n",
        eval_batch=150,
        evals=5,
        order=by_size_within,
    ),
}


def sampled_accuracy(model, tok, task, problems, max_new_tokens: int = 8) -> float:
    """Share of temperature-1 samples (one per problem) that are exactly right: the RL signal."""
    prompts = [render_prompt(tok, p) for p in problems]
    comps = generate_completions(
        model,
        tok,
        prompts,
        n_samples=1,
        max_new_tokens=max_new_tokens,
        sampling=sampling_kwargs(1.0, 1.0),
        task=task,
    )
    return float(np.mean([task.is_correct(p, t) for p, t in zip(problems, comps.texts)]))


def parse_phases(text: str, drop: float) -> list[tuple[int, float, float]]:
    """'800:3e-3:0,500:1e-3' -> [(800, 0.003, 0.0), (500, 0.001, drop)]: SFT phases of (steps, peak lr,
    the teacher's error probability; `drop` where a phase gives none)."""
    try:
        items = [item.split(":") for item in text.split(",")]
        phases = [(int(x[0]), float(x[1]), float(x[2]) if len(x) > 2 else drop) for x in items]
    except (ValueError, IndexError):
        raise SystemExit(f"--phases must look like 800:3e-3:0,500:1e-3, got {text!r}") from None
    if not phases or any(len(x) > 3 for x in items):
        raise SystemExit(f"--phases must look like 800:3e-3:0,500:1e-3, got {text!r}")
    if any(n < 1 or lr <= 0 or not 0 <= q <= 1 for n, lr, q in phases):
        raise SystemExit(f"--phases needs positive steps and learning rates, drops in [0, 1]: {text!r}")
    return phases


def build(
    phases: list[tuple[int, float, float]],
    batch: int,
    seed: int,
    resume: Path | None = None,
    resume_phases: int = 0,
    progress: bool = True,
    model_config: dict | None = None,
    organism: Organism = ORGANISMS["add"],
    task_params: dict | None = None,
):
    """(model, tokenizer, history) after the SFT phases; each phase is a fresh AdamW with warm-up and a
    cosine decay to 0 (a warm restart), reading the next `steps * batch` problems of one seeded stream,
    with the targets of a teacher of that phase's error probability.

    `resume`: a model saved after the first `resume_phases` phases of this same command; those phases
    are skipped, which gives the same result as running them (each phase starts a fresh optimizer)."""
    torch.manual_seed(seed)
    task = get_task(organism.task, **(organism.task_params | (task_params or {})))
    tok = make_word_tokenizer(organism.words)
    model = make_lab_model(tok, seed, **(organism.config | (model_config or {})))
    if resume is not None:
        model = AutoModelForCausalLM.from_pretrained(resume, dtype=torch.float32)
        set_generation_ids(model, tok)
    problems = organism.order(task.train_problems(sum(n for n, _, _ in phases) * batch, seed), batch)
    teacher_rng = np.random.default_rng([seed, 2])
    drops = [q for n, _, q in phases for _ in range(n * batch)]  # each problem's teacher
    targets = [task.teacher(p, q, teacher_rng) for p, q in zip(problems, drops)]
    prompts = [render_prompt(tok, p) for p in problems]
    held_out = task.eval_problems(organism.eval_per, seed=10_000)  # a fixed set, apart from every RL seed's
    evaluate_now = _evaluator(model, tok, task, held_out, organism)
    history, first = [], 0
    for i, (steps, lr, _) in enumerate(phases):
        if i >= resume_phases:
            examples = _phase_examples(prompts, targets, first * batch, batch)
            cfg = SFTConfig(
                steps=steps,
                lr=lr,
                warmup_steps=min(100, steps // 10),
                eval_every=max(1, steps // organism.evals),
                progress=progress,
            )
            history += [
                h | {"phase": i, "step": first + h["step"]}
                for h in supervised_train(model, tok, examples, cfg, evaluate=evaluate_now)
            ]
        first += steps
    return model, tok, history


def _phase_examples(prompts: list, targets: list, offset: int, batch: int):
    """step -> the (prompt, target) pairs of that SFT step of a phase starting at problem `offset`."""

    def examples(step: int) -> list:
        lo = offset + step * batch
        return list(zip(prompts[lo : lo + batch], targets[lo : lo + batch]))

    return examples


def _evaluator(model, tok, task, held_out, organism: Organism):
    """step -> held-out greedy and sampled exact match, and greedy by difficulty (the SFT history's row)."""
    new = organism.max_new_tokens

    def evaluate_now(step: int) -> dict:
        with torch.no_grad():
            greedy = evaluate(
                model,
                tok,
                task,
                problems=held_out,
                max_new_tokens=new,
                max_turns=1,
                batch_size=organism.eval_batch,
            )
            n = sum(k for _, k in greedy.values())
            out = {
                "greedy": sum(a * k for a, k in greedy.values()) / n,
                "sampled": sampled_accuracy(model, tok, task, held_out, new),
            }
        return out | {f"{organism.level_key}{d}": a for d, (a, _) in greedy.items()}

    return evaluate_now


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--organism", choices=sorted(ORGANISMS), default="add", help="which lab model")
    ap.add_argument(
        "--phases",
        default=None,
        help="SFT phases steps:peak_lr[:drop],... (each cosine-annealed to "
        "lr 0 after a warm-up; a later phase is a warm restart; drop: that phase's teacher error "
        "probability, default --drop; default: the organism's)",
    )
    ap.add_argument("--batch", type=int, default=None, help="SFT batch (default: the organism's)")
    ap.add_argument(
        "--drop",
        type=float,
        default=None,
        help="the teacher's error probability: a carry forgotten (add, 0.6) or a contradicting "
        "statement misread (kk); default: the organism's",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: reproducible)")
    ap.add_argument("--out", type=Path, default=None, help="default: the organism's assets folder")
    ap.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="a model saved after the first "
        "--resume-phases phases of the same command (those phases are skipped)",
    )
    ap.add_argument("--resume-phases", type=int, default=0)
    ap.add_argument(
        "--task-params",
        type=json.loads,
        default=None,
        help="task parameter overrides as JSON, e.g. '{\"n_people\": [2, 3]}'",
    )
    ap.add_argument(
        "--model-config",
        type=json.loads,
        default=None,
        help="LlamaConfig overrides as JSON, e.g. '{\"hidden_size\": 192}'",
    )
    return ap


def save(out: Path, model, tok, history: list[dict], settings: dict) -> None:
    """The weights, the tokenizer and the SFT history (with the settings that made them) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "sft_history.json").write_text(
        json.dumps({"settings": settings, "history": history}, indent=1) + "\n"
    )
    size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
    print(
        f"{out}: {size:.1f} MB; held-out greedy accuracy {history[-1]['greedy']:.3f}, "
        f"sampled {history[-1]['sampled']:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    organism = ORGANISMS[args.organism]
    for key in ("phases", "batch", "drop"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(organism, key))
    args.out = args.out or lab_dir(organism.model)
    torch.set_num_threads(args.threads)
    phases = parse_phases(args.phases, args.drop)
    model, tok, history = build(
        phases,
        args.batch,
        args.seed,
        args.resume,
        args.resume_phases,
        model_config=args.model_config,
        organism=organism,
        task_params=args.task_params,
    )
    settings = {k: getattr(args, k) for k in ("organism", "phases", "batch", "seed", "task_params")}
    settings["drop"] = phases[-1][2]  # the teacher of the plateau the model ends on
    save(args.out, model, tok, history, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
