"""The lab study: token-weighting rules x paired seeds on the lab model, with bootstrap intervals.

    python scripts/study.py                        # 7 rules x 5 seeds + SFT control -> runs/study
    python scripts/study.py --seeds 0 1 2 --rules grpo tr_grpo --out runs/study3
    python scripts/study.py --table-only           # re-summarise finished runs, train nothing
    python scripts/study.py --organism kk --seeds 0 1 2 --out runs/study_kk --table docs/study_kk_results.md
    python scripts/study.py --set steps=4 eval_per_difficulty=2 --out /tmp/smoke   # pipeline smoke test

Every (rule, seed) trains configs/lab_<organism>_<rule>.toml (lab_add_ by default) with that seed into
OUT/<rule>-s<seed> (a finished run there is reused, so an interrupted study continues). Seeds are paired:
the same seed gives every rule the same training prompts, held-out set and step-0 sampling stream. The
control continues the lab model's own SFT (its sloppy teacher, the RL learning rate, batch = prompts x
group) for the wall time of the same seed's grpo run, evaluated on the same held-out set
(OUT/control-s<seed>.json).

Per run (tokengrad run format; "live" = steps whose update had a non-zero gradient):
    acc_start, acc_final, acc_gain   held-out greedy exact match at step -1 and after the last step
    acc_mean                         its mean over the evaluations after updates (speed of learning)
    acc_d<k>, gain_d<k>              the same by difficulty (number of carries k)
    live_share                       share of steps with a gradient
    low_tokens, low_update           AR-Lopti premise: p < 0.25 tokens' share of the loss tokens and of the
                                     update <g_B, g>/|g|^2 (|g|^2-weighted over updates), live bucket steps
    cr_<bucket>                      correct ratio by probability bucket (share of positive-advantage
                                     tokens whose probability rose), mean over live bucket steps
    grad_cv, spikes                  TR-GRPO: std/mean of the grad norm and robust-z spikes, live steps
    entropy_start, entropy_end       mean token entropy over the first / last 10 % of steps
    overlook_start, overlook_end     lab-kk: share of sampled checks saying ok after a written contradiction
Summary (written to --table, docs/study_results.md by default): mean over seeds with a percentile
bootstrap 95 % interval (resampling seeds), and for every rule the paired difference to grpo.
Figures (--figures): entropy trajectories and accuracy gains, rendered by tokengrad's export module.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import tokengrad  # noqa: E402
from tokengrad import load_run  # noqa: E402
from tokengrad.figures.smoothing import find_spikes  # noqa: E402
from tokengrad.figures.summary import coefficient_of_variation  # noqa: E402
from tokengrad.read.headline import low_prob_shares  # noqa: E402
from tokengrad.train.config import load_config, parse_override  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_report import report  # noqa: E402

RULES = ("grpo", "tr_grpo", "tr_grpo_reverse", "ar", "lopti", "ar_lopti", "cw_grpo")
# GRPO with a second optimizer step per batch (configs/lab_add_grpo_<variant>.toml): is Lopti's gain its
# phase split or only its second step? (mu2: num_iterations = 2; mb2: mini_batches = 2)
CONTROLS = ("grpo_mu2", "grpo_mb2")
LOW_EDGE = 0.25  # the lowest probability bucket of the default edges [0, .25, .5, .75, 1]


ORGANISMS = ("add", "kk")  # lab-add (configs/lab_add_*.toml) and lab-kk (configs/lab_kk_*.toml)


def teacher_drop(organism: str) -> float:
    """The error probability of the teacher the shipped lab model was trained on (its SFT history):
    a forgotten carry (add), a misread contradicting statement (kk)."""
    from tokengrad.train.lab import lab_dir

    history = lab_dir(f"lab-{organism}") / "sft_history.json"
    return float(json.loads(history.read_text())["settings"]["drop"])


def config_path(rule: str, organism: str = "add") -> Path:
    return ROOT / "configs" / f"lab_{organism}_{rule}.toml"


def available_rules(organism: str) -> list[str]:
    """The rules and controls with a config for this organism, in the study's order."""
    return [r for r in (*RULES, *CONTROLS) if config_path(r, organism).exists()]


def run_one(rule: str, seed: int, run_dir: Path, overrides: dict, organism: str = "add") -> Path:
    """Train (rule, seed) into run_dir unless a finished run is there; its wall time goes to study.json."""
    meta = run_dir / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("finished"):
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    tokengrad.train.run(
        str(config_path(rule, organism)),
        seed=seed,
        run_dir=str(run_dir),
        run_name=f"{rule}-s{seed}",
        **({"progress": False, "checkpoint": False} | overrides),
    )
    (run_dir / "study.json").write_text(json.dumps({"wall_seconds": time.perf_counter() - t0}) + "\n")
    return run_dir


def _unit(kind: str, rule: str, seed: int, out: Path, overrides: dict, threads: int, organism: str) -> str:
    """One unit of the study in a worker process: a (rule, seed) run, or the seed's SFT control (which
    needs the wall time of that seed's grpo run, so it is scheduled after it)."""
    torch.set_num_threads(threads)
    if kind == "run":
        run_one(rule, seed, out / f"{rule}-s{seed}", overrides, organism)
        return f"finished {out}/{rule}-s{seed}"
    wall = json.loads((out / f"grpo-s{seed}" / "study.json").read_text())["wall_seconds"]
    run_control(seed, wall, out, overrides, organism)
    return f"finished {out}/control-s{seed}.json"


def train_all(
    rules: list[str],
    seeds: list[int],
    out: Path,
    overrides: dict,
    jobs: int,
    threads: int,
    control: bool,
    organism: str = "add",
) -> None:
    """Every (rule, seed) run, seed-major (an interrupted study has every rule at the early seeds), then the
    controls, on `jobs` worker processes. Finished runs and controls are reused."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    out.mkdir(parents=True, exist_ok=True)
    units = [("run", rule, seed) for seed in seeds for rule in rules]
    units += [("control", "grpo", seed) for seed in seeds if control and "grpo" in rules]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        runs = [pool.submit(_unit, *u, out, overrides, threads, organism) for u in units if u[0] == "run"]
        for f in runs:
            print(f.result(), flush=True)
        controls = [u for u in units if u[0] == "control"]
        for f in [pool.submit(_unit, *u, out, overrides, threads, organism) for u in controls]:
            print(f.result(), flush=True)


def accuracy(results: dict) -> float:
    """n-weighted mean of {difficulty: (accuracy, n)}."""
    n = sum(k for _, k in results.values())
    return sum(a * k for a, k in results.values()) / n


def run_control(seed: int, seconds: float, out: Path, overrides: dict, organism: str = "add") -> dict:
    """SFT continuation of the lab model on its sloppy teacher for `seconds`; held-out accuracy
    before/after."""
    from tokengrad.train.generation import evaluate, render_prompt
    from tokengrad.train.models import load_model
    from tokengrad.train.sft import SFTConfig, supervised_train
    from tokengrad.train.tasks import get_task

    path = out / f"control-s{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    cfg = load_config(config_path("grpo", organism), {"seed": seed, **overrides})
    torch.manual_seed(seed)
    model, tok = load_model(cfg.model, seed=seed)
    task = get_task(cfg.task, **cfg.task_params)
    held = task.eval_problems(cfg.eval_per_difficulty, seed)
    batch = cfg.prompts_per_step * cfg.group_size
    problems = task.train_problems(batch * cfg.steps, seed)
    rng, drop = np.random.default_rng([seed, 3]), teacher_drop(organism)
    pairs = [(render_prompt(tok, p), task.teacher(p, drop, rng)) for p in problems]

    def examples(step: int) -> list[tuple[str, str]]:
        return [pairs[(step * batch + j) % len(pairs)] for j in range(batch)]

    def held_out(step: int) -> dict:
        res = evaluate(
            model, tok, task, problems=held, max_new_tokens=cfg.max_new_tokens, max_turns=1, batch_size=batch
        )
        return {"accuracy": accuracy(res), **{f"acc_d{d}": a for d, (a, _) in res.items()}}

    start = held_out(-1)
    sft = SFTConfig(
        steps=10**6, lr=cfg.lr, min_lr=cfg.lr, warmup_steps=0, max_seconds=seconds, progress=False
    )
    end = supervised_train(model, tok, examples, sft, evaluate=held_out)[-1]
    row = {
        "seed": seed,
        "seconds": seconds,
        "sft_steps": end["step"] + 1,
        "acc_start": start["accuracy"],
        "acc_final": end["accuracy"],
        "acc_gain": end["accuracy"] - start["accuracy"],
    }
    path.write_text(json.dumps(row) + "\n")
    return row


def eval_metrics(ev: pd.DataFrame) -> dict:
    """Held-out accuracy at the first (step -1) and last evaluation, overall and per difficulty."""
    out = {}
    for tag, step in (("start", ev["step"].min()), ("final", ev["step"].max())):
        e = ev[ev["step"] == step]
        out[f"acc_{tag}"] = float((e["accuracy"] * e["n"]).sum() / e["n"].sum())
        for d, a in zip(e["difficulty"], e["accuracy"]):
            out[f"{tag}_d{d}"] = float(a)
    out["acc_gain"] = out["acc_final"] - out["acc_start"]
    after = ev[ev["step"] >= 0].groupby("step").apply(lambda e: (e["accuracy"] * e["n"]).sum() / e["n"].sum())
    out["acc_mean"] = float(after.mean())  # mean over the evaluations after updates: speed of learning
    for key in [k for k in out if k.startswith("final_d")]:
        d = key.removeprefix("final_d")
        out[f"acc_d{d}"] = out.pop(key)
        out[f"gain_d{d}"] = out[f"acc_d{d}"] - out.pop(f"start_d{d}")
    return out


def bucket_metrics(run, live_steps: set, step_range: tuple[int, int] | None = None) -> dict:
    """Low-probability shares of tokens and update (tokengrad.read.headline.low_prob_shares, the one
    definition the dashboard, export and README use: sum_u <g_B,u, g_u> / sum_u |g_u|^2 over the analysed
    updates with a gradient), and the correct ratio by bucket on live bucket steps."""
    head = low_prob_shares(run, step_range, threshold=LOW_EDGE)
    b = run.buckets
    b = b[b["step"].isin(live_steps) & (b["bucket"] != "residual")]
    if b.empty or head.source != "bucket analysis":
        return {}
    out = {"low_tokens": head.token_share, "low_update": head.update_share}
    for label, g in b.groupby("bucket"):
        out[f"cr_{label}"] = float(g["correct_ratio"].mean())
    return out


def kk_metrics(run, first, last) -> dict:
    """lab-kk: the share of sampled checks that say ok after a written contradiction (the sloppy teacher's
    q = 0.6; lab_kk_check.overlooked), first / last 10 % of steps."""
    from lab_kk_check import overlooked

    return {"overlook_start": overlooked(run.samples, first), "overlook_end": overlooked(run.samples, last)}


TASK_METRICS = {"lab_kk": kk_metrics}  # per task: extra metrics (run, first steps, last steps) -> dict


def first_steps(run, horizon: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's steps and evaluations before step `horizon` (None: all). The lab configs keep the
    learning rate constant and draw problems as a seeded stream, so a run's first N steps are the run
    a config with steps = N trains: runs of different lengths compare at one horizon."""
    if horizon is None:
        return run.steps, run.evals
    n = int(run.steps["step"].max()) + 1
    if n < horizon:
        raise SystemExit(f"{run.meta['run_name']}: {n} steps, fewer than --steps {horizon}")
    return run.steps[run.steps["step"] < horizon], run.evals[run.evals["step"] < horizon]


def run_row(run_dir: Path, horizon: int | None = None) -> dict:
    """One run's metrics over its first `horizon` steps (module docstring)."""
    run = load_run(run_dir)
    run_steps, run_evals = first_steps(run, horizon)
    steps = run_steps.groupby("step").agg(
        grad_norm=("grad_norm", "max"), entropy=("entropy_mean", "mean"), sampled=("accuracy", "mean")
    )
    live = steps[steps["grad_norm"] > 0]
    tenth = max(1, len(steps) // 10)
    gn = live["grad_norm"].to_numpy(dtype=float)
    row = {
        "rule": str(run.meta["run_name"]).rsplit("-s", 1)[0],  # the config: grpo_mu2 is not grpo
        "seed": int(run.meta["config"]["seed"]),
        "live_share": len(live) / len(steps),
        "grad_cv": coefficient_of_variation(gn),
        "spikes": int(len(find_spikes(gn))) if len(gn) else 0,
        "entropy_start": float(steps["entropy"].iloc[:tenth].mean()),
        "entropy_end": float(steps["entropy"].iloc[-tenth:].mean()),
        "sampled_start": float(steps["sampled"].iloc[:tenth].mean()),
        "sampled_end": float(steps["sampled"].iloc[-tenth:].mean()),
        **eval_metrics(run_evals),
        **TASK_METRICS.get(run.meta["config"]["task"], lambda *_: {})(
            run, steps.index[:tenth], steps.index[-tenth:]
        ),
        **bucket_metrics(run, set(live.index), None if horizon is None else (0, horizon - 1)),
    }
    study = run_dir / "study.json"
    cut = len(run_steps) < len(run.steps)  # study.json's wall time is the whole run's
    row["wall_seconds"] = (
        json.loads(study.read_text())["wall_seconds"] if study.exists() and not cut else np.nan
    )
    return row


# per organism: the figure names' prefix and what a difficulty level counts
FIGURE_NAMING = {"add": ("study", "carries"), "kk": ("study_kk", "people")}


def figures(
    out: Path, fig_dir: Path, rules: list[str], organism: str = "add", horizon: int | None = None
) -> list[Path]:
    """Per rule, pooled over seeds: entropy and sampled accuracy (mean over seeds) and held-out accuracy by
    difficulty over steps, drawn and written by tokengrad's figure/export code."""
    from tokengrad.figures import make_metric_figure
    from tokengrad.figures.evals import make_accuracy_over_steps_figure
    from tokengrad.figures.export import write_static
    from tokengrad.figures.figureset import FigureSpec

    frames, evals = {}, {}
    for rule in rules:
        runs = [load_run(p) for p in sorted(out.glob(f"{rule}-s*")) if (p / "meta.json").exists()]
        if runs:
            cols = ["entropy_mean", "accuracy", "reward_mean"]
            cut = [first_steps(r, horizon) for r in runs]
            steps = pd.concat([s for s, _ in cut])
            frames[rule] = steps.groupby("step", as_index=False)[cols].mean().assign(rank=0)
            evals[rule] = pd.concat([e for _, e in cut], ignore_index=True)
    prefix, levels = FIGURE_NAMING[organism]
    specs = [
        FigureSpec(
            f"{prefix}_entropy",
            make_metric_figure(frames, "entropy_mean", smoothing=0.8, title="token entropy, mean over seeds"),
        ),
        FigureSpec(
            f"{prefix}_sampled_accuracy",
            make_metric_figure(
                frames, "accuracy", smoothing=0.8, title="sampled exact match, mean over seeds"
            ),
        ),
        FigureSpec(
            f"{prefix}_heldout_by_{levels}",
            make_accuracy_over_steps_figure(
                evals, by_difficulty=True, title=f"held-out greedy exact match by {levels}, seeds pooled"
            ),
            width="page",
            height_in=3.0,
        ),
    ]
    fig_dir.mkdir(parents=True, exist_ok=True)
    return write_static(specs, fig_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--organism", choices=ORGANISMS, default="add", help="lab-add or lab-kk configs")
    ap.add_argument("--rules", nargs="+", default=None, choices=[*RULES, *CONTROLS], help="default: all")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "study")
    ap.add_argument(
        "--table", default=str(ROOT / "docs" / "study_results.md"), help="markdown summary ('' = none)"
    )
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures"), help="PNG folder ('' = none)")
    ap.add_argument("--baseline", default="grpo", help="the rule every paired difference is taken to")
    ap.add_argument("--no-control", action="store_true", help="skip the SFT-continuation control")
    ap.add_argument("--table-only", action="store_true", help="summarise the runs in --out, train nothing")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (1: deterministic)")
    ap.add_argument("--jobs", type=int, default=1, help="runs trained at once, each in its own process")
    ap.add_argument("--steps", type=int, default=None, help="summarise each run's first N steps")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = dict(parse_override(item) for item in args.set)
    args.rules = args.rules or available_rules(args.organism)
    missing = [r for r in args.rules if not config_path(r, args.organism).exists()]
    if missing:
        have = available_rules(args.organism)
        raise SystemExit(f"no lab_{args.organism} config for {missing}; have {have}")
    if not args.table_only:
        run = (args.jobs, args.threads, not args.no_control, args.organism)
        train_all(args.rules, args.seeds, args.out, overrides, *run)
    rows = [
        run_row(args.out / f"{rule}-s{seed}", args.steps)
        for seed in args.seeds
        for rule in args.rules
        if (args.out / f"{rule}-s{seed}" / "meta.json").exists()
    ]
    rows += [
        {"rule": "control", **json.loads(p.read_text())}
        for seed in args.seeds
        if (p := args.out / f"control-s{seed}.json").exists()
    ]
    if not rows:
        raise SystemExit(f"no runs under {args.out}")
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "study_runs.csv", index=False)
    text = report(df, [*RULES, *CONTROLS, "control"], args.baseline, args.steps)
    print(text)
    if args.table:
        table = Path(args.table)
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(text)
    if args.figures:
        print(*figures(args.out, Path(args.figures), args.rules, args.organism, args.steps), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
