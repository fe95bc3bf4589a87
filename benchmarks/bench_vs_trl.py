"""\
Step time of the built-in trainer against TRL's GRPOTrainer, plain and with the tokengrad recorder attached.

    python benchmarks/bench_vs_trl.py                  # SmolLM2-135M-Instruct, arithmetic, 2 x 4 x 40 tokens
    python benchmarks/bench_vs_trl.py --model tiny --steps 3 --max-new-tokens 16    # a quick run
    python benchmarks/bench_vs_trl.py --smoke          # tiny model, 2 steps of 1 x 2 x 4 tokens: every figure

All three trainers get the same model, task (1-2 digit +/- arithmetic and its reward), prompts (rendered
with the same chat template and response prefix), batch (B prompts x G completions), completion length,
sampling temperature, learning rate, clip range, loss aggregation (token-mean) and precision (fp32), with
no KL term, no evaluation and (but for the last) no bucket analysis:

    ours          tokengrad's Trainer, step by step       one step = Trainer.step(step)
    trl           trl.GRPOTrainer(...).train()           one step = on_step_begin -> on_step_end
    trl+recorder  the same with tokengrad.integrations.trl.attach(trainer, run_dir)
    trl+buckets   the same with attach(..., buckets=2): the bucket analysis on every other step
    trl+kept      with --bucket-activations: attach(..., buckets=2, bucket_activations=True), the bucket
                  step's forward without gradient checkpointing (no layer recomputed by its passes)

The trl+buckets run gives the cost of an analysed step: the median step with bucket rows over the
median step without, in the same run (target <= 1.5 in CPU time). Its reward adds the share of distinct
characters to the arithmetic reward, so that every group has a spread of rewards and every token a
non-zero coef: with the arithmetic reward alone most groups of an untrained model score 0, their coef is
0 and their bucket passes are skipped, which would make the analysis look free.

Each step is timed twice: wall seconds and CPU seconds of this process (time.process_time). With one
torch thread (the default) CPU time does not grow when other jobs share the cores, so on a busy machine
the CPU-time ratios are the ones to read; wall time is printed too. The first step of each trainer is a
warm-up and is dropped; medians of the rest are printed, then the ratios ours / trl and
(trl+recorder) / trl, and our per-phase wall medians (time_generate, time_score, time_update,
time_record from the steps table) to show where our time goes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))
from measure import SMOKE_HELP  # noqa: E402

from tokengrad import load_run  # noqa: E402

TARGET_OURS_TRL = 0.75  # issue 25: built-in trainer step / TRL step, same settings
TARGET_BUCKET_STEP = 1.5  # issue 38: TRL step with bucket analysis / recorded step without
BUCKET_EVERY = 2
from tokengrad.train.config import make_config  # noqa: E402
from tokengrad.train.generation import render_prompt  # noqa: E402
from tokengrad.train.models import load_model  # noqa: E402
from tokengrad.train.tasks import get_task  # noqa: E402
from tokengrad.train.trainer import Trainer  # noqa: E402

TASK, TASK_PARAMS = "arithmetic", {"digits": [1, 2], "ops": "+-"}
PHASES = ("time_generate", "time_score", "time_update", "time_record")


def shared_settings(a: argparse.Namespace) -> dict:
    return dict(
        prompts_per_step=a.prompts,
        group_size=a.group,
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        lr=a.lr,
        eps_low=0.2,
        eps_high=0.28,
        aggregation="dapo",
        beta=0.0,
        seed=0,
        bf16=False,
    )


class StepTimer:
    """Wall and CPU seconds of each step, between begin() and end()."""

    def __init__(self):
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._t0 = (0.0, 0.0)

    def begin(self, *args, **kwargs):
        self._t0 = (time.perf_counter(), time.process_time())

    def end(self, *args, **kwargs):
        self.wall.append(time.perf_counter() - self._t0[0])
        self.cpu.append(time.process_time() - self._t0[1])

    def timed(self) -> tuple[list[float], list[float]]:
        """(wall, cpu) without the warm-up step."""
        return self.wall[1:], self.cpu[1:]


def run_ours(a: argparse.Namespace, out: Path) -> tuple[StepTimer, dict]:
    """Step times of the built-in trainer and its per-phase wall medians (warm-up step dropped)."""
    cfg = make_config(
        dict(
            model=a.model,
            task=TASK,
            task_params=TASK_PARAMS,
            steps=a.steps,
            progress=False,
            run_dir=str(out / "ours"),
            device="cpu",
            **shared_settings(a),
        )
    )
    trainer, timer = Trainer(cfg).setup(), StepTimer()
    with trainer.rec:
        for step in range(a.steps):
            timer.begin()
            trainer.step(step)
            timer.end()
    steps = load_run(trainer.run_dir).steps.sort_values("step").iloc[1:]
    return timer, {p: float(steps[p].median()) for p in PHASES if p in steps}


def trl_trainer(a: argparse.Namespace, out: Path, name: str, spread: bool = False, steps: int = 0):
    """TRL's GRPOTrainer on the same prompts, reward and settings as the built-in trainer (`spread`: plus
    the share of distinct characters in the completion, which varies within every group)."""
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    s = shared_settings(a)
    task = get_task(TASK, **TASK_PARAMS)
    problems = task.train_problems(s["prompts_per_step"] * (steps or a.steps), s["seed"])
    model, tok = load_model(a.model, seed=s["seed"])
    data = Dataset.from_dict(
        {"prompt": [render_prompt(tok, p) for p in problems], "index": list(range(len(problems)))}
    )

    def arithmetic_reward(completions, index, **kwargs) -> list[float]:
        return [
            task.reward(problems[i], c) + (len(set(c)) / max(len(c), 1) if spread else 0.0)
            for c, i in zip(completions, index)
        ]

    args = trl.GRPOConfig(
        output_dir=str(out / name / "trl_output"),
        max_steps=steps or a.steps,
        learning_rate=s["lr"],
        per_device_train_batch_size=s["prompts_per_step"] * s["group_size"],
        num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        epsilon=s["eps_low"],
        epsilon_high=s["eps_high"],
        loss_type="dapo",
        beta=s["beta"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=s["seed"],
        disable_tqdm=True,
        shuffle_dataset=False,
    )
    timer = StepTimer()
    callback = type(
        "StepTimerCallback",
        (TrainerCallback,),
        {
            "on_step_begin": lambda self, *x, **k: timer.begin(),
            "on_step_end": lambda self, *x, **k: timer.end(),
        },
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=[arithmetic_reward],
            args=args,
            train_dataset=data,
            processing_class=tok,
            callbacks=[callback()],
        )
    return trainer, timer


def run_trl(a: argparse.Namespace, out: Path, attached: bool) -> StepTimer:
    name = "trl_recorder" if attached else "trl"
    trainer, timer = trl_trainer(a, out, name)
    if attached:
        from tokengrad.integrations.trl import attach

        attach(trainer, out / name / "run")
    trainer.train()
    return timer


def run_trl_buckets(a: argparse.Namespace, out: Path, kept: bool = False) -> tuple[StepTimer, set[int]]:
    """TRL with the recorder and buckets=2, at least 3 steps so that the timed steps (after the warm-up
    step 0) hold an analysed one (2) and one without (1); returns the timer and the analysed steps.
    `kept`: attach(bucket_activations=True), the bucket step's forward without gradient checkpointing."""
    from tokengrad.integrations.trl import attach
    from tokengrad.record import Buckets

    name = "trl_buckets_kept" if kept else "trl_buckets"
    trainer, timer = trl_trainer(a, out, name, spread=True, steps=max(a.steps, 3))
    buckets = Buckets(every=BUCKET_EVERY, edges=tuple(a.edges)) if a.edges else BUCKET_EVERY
    attach(trainer, out / name / "run", buckets=buckets, bucket_activations=kept)
    trainer.train()
    return timer, {int(s) for s in load_run(out / name / "run").buckets.step}


def report_bucket_step(timer: StepTimer, analysed: set[int], kept: bool = False) -> None:
    """Median analysed step / median step without analysis, both after the warm-up step, CPU and wall."""
    kinds = {True: ([], []), False: ([], [])}
    for i, (wall, cpu) in enumerate(zip(timer.wall, timer.cpu)):
        if i > 0:  # step 0 is the warm-up
            kinds[i in analysed][0].append(wall)
            kinds[i in analysed][1].append(cpu)
    (bw, bc), (nw, nc) = kinds[True], kinds[False]
    name, what = ("trl+kept", " (activations kept)") if kept else ("trl+buckets", "")
    print(
        f"  {name:13s} bucket steps {sorted(s for s in analysed if s > 0)}: cpu per analysed step "
        f"{', '.join(f'{x:.2f}' for x in bc)}, per step without {', '.join(f'{x:.2f}' for x in nc)}"
    )
    print(
        f"  ratio trl bucket step{what} / recorded step:  cpu {median(bc) / median(nc):.2f}   "
        f"wall {median(bw) / median(nw):.2f}   (target cpu <= {TARGET_BUCKET_STEP})"
    )


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=4, help="steps per trainer; the first is a warm-up")
    ap.add_argument("--prompts", type=int, default=2, help="B: prompts per step")
    ap.add_argument("--group", type=int, default=4, help="G: completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--bucket-activations",
        action="store_true",
        help="also time attach(buckets=2, bucket_activations=True): bucket steps without checkpointing",
    )
    ap.add_argument(
        "--edges",
        type=float,
        nargs="+",
        help="bucket edges of the bucket runs (default 0 .25 .5 .75 1: 4 buckets, 3 passes)",
    )
    ap.add_argument(
        "--buckets-only",
        action="store_true",
        help="time only the bucket runs (trl+buckets, and trl+kept with --bucket-activations)",
    )
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args(argv)
    if a.smoke:
        a.model, a.steps, a.prompts, a.group, a.max_new_tokens = "tiny", 2, 1, 2, 4
        a.bucket_activations = True  # every figure
    if a.steps < 2:
        ap.error("--steps must be >= 2 (the first step is a warm-up)")
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        timers, phases = {}, {}
        if not a.buckets_only:
            timers["ours"], phases = run_ours(a, out)
            timers["trl"] = run_trl(a, out, attached=False)
            timers["trl+recorder"] = run_trl(a, out, attached=True)
        bucket_timer, analysed = run_trl_buckets(a, out)
        kept = run_trl_buckets(a, out, kept=True) if a.bucket_activations else None
    print(
        f"model {a.model}, task {TASK} {TASK_PARAMS}, B={a.prompts} G={a.group} "
        f"max_new_tokens={a.max_new_tokens}, {a.steps - 1} timed steps each, torch threads {a.threads}, "
        f"bucket edges {tuple(a.edges) if a.edges else 'default (0, .25, .5, .75, 1)'}"
    )
    med = {}
    for name, timer in timers.items():
        wall, cpu = timer.timed()
        med[name] = (median(wall), median(cpu))
        print(
            f"  {name:13s} median step: wall {med[name][0]:7.2f} s, cpu {med[name][1]:7.2f} s   "
            f"(cpu per step: {', '.join(f'{x:.2f}' for x in cpu)})"
        )
    for num, den in (("ours", "trl"), ("trl+recorder", "trl")) if timers else ():
        target = f"   (target cpu <= {TARGET_OURS_TRL})" if num == "ours" else ""
        print(
            f"  ratio {num} / {den}:  cpu {med[num][1] / med[den][1]:.2f}   "
            f"wall {med[num][0] / med[den][0]:.2f}{target}"
        )
    report_bucket_step(bucket_timer, analysed)
    if kept is not None:
        report_bucket_step(*kept, kept=True)
    if phases:
        print(
            "  ours, median wall seconds per phase: "
            + ", ".join(f"{k[5:]} {v:.2f}" for k, v in phases.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
