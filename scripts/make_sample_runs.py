"""Create the shipped sample runs: the two CPU lab models and SmolLM2-135M, each under GRPO, TR-GRPO and
AR+Lopti, and three lab-add GRPO runs for the Rollout, Entropy and What if pages.

    python scripts/make_sample_runs.py                              # all twelve runs into sample_runs/
    python scripts/make_sample_runs.py --only lab_grpo --steps 5    # a quick look at one run
    python scripts/make_sample_runs.py --from-study runs/study      # lab runs = the study's seed-0 runs
    tokengrad dashboard sample_runs                                 # then look at them

`lab_<rule>`: configs/lab_add_<rule>.toml (the lab model `lab-add` on compact 4-digit addition; the configs
differ only in the weighting rule and its parameters). `lab_kk_<rule>`: configs/lab_kk_<rule>.toml (the lab
model `lab-kk` on Knights and Knaves with a plain-word trace; the configs and seed of the seed-0 runs of
`scripts/study.py --organism kk`, recorded under a token budget of 512 rows per step).
`lab_grpo_whatif`: configs/lab_add_grpo_whatif.toml (GRPO with seed 2, 100 steps, the what-if updates of
TR-GRPO and Lopti and the bucket analysis every 5 steps). `lab_grpo_rollout`:
configs/lab_add_grpo_rollout.toml (a bf16, top-p 0.9 sampler against the fp32 trainer, TRL's
sequence_mask removing sequences, num_iterations = 2). `lab_grpo_entropy`:
configs/lab_add_grpo_entropy.toml (lab_grpo's config with seed 1, 100 steps, entropy attribution and the
bucket analysis every 5 steps).
`smollm_<rule>`: configs/smollm_sample.toml
(SmolLM2-135M-Instruct on 1-2 digit arithmetic, refilling dynamic sampling) with the rule set on the
command line. Within each family every run uses the same seed, so the runs share the training prompts, the
held-out set and the sampling stream of step 0 (later steps diverge only because the policies do). The rule
parameters are the papers' published ones: TR-GRPO (arXiv 2511.00066) with the rule's documented defaults,
AR + Lopti (arXiv 2505.12929) with alpha 0.3, eta 0.5, its authors' best Knights-and-Knaves setting.

Repeatable on CPU: torch runs on one thread (a rerun reproduces the same completions, and on a shared
machine one thread is also the fastest). No checkpoint is written: the run format is what ships.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import tokengrad  # noqa: E402
from tokengrad.read.served_root import DEMO_ROOT  # noqa: E402
from tokengrad.train.checkpoint import checkpoint_path  # noqa: E402

# lab-kk steps make ~6,400 token rows (traces of ~100 words, 64 per step); last round's shorter traces
# (1,800 rows per step) already took 10-16 MB per run with every row, so these runs keep 512 rows per step
# (whole completions and the largest update shares), with exact aggregates
KK_TOKEN_BUDGET = 512
RULE_PARAMS = {"grpo": {}, "tr_grpo": {}, "ar_lopti": {"alpha": 0.3, "eta": 0.5}}
# run name -> (config, overrides): the lab configs carry their rule, the SmolLM2 config gets it here
RUNS = (
    {f"lab_{r}": (f"lab_add_{r}.toml", {}) for r in RULE_PARAMS}
    | {f"lab_kk_{r}": (f"lab_kk_{r}.toml", {"token_budget": KK_TOKEN_BUDGET}) for r in RULE_PARAMS}
    | {
        f"smollm_{r}": ("smollm_sample.toml", {"weighting": r, "weighting_params": p})
        for r, p in RULE_PARAMS.items()
    }
    # runs that fill the Rollout and Entropy pages: a bf16 / top-p sampler against the fp32 trainer with
    # sequence_mask and mu = 2, and GRPO with entropy attribution every 5 steps (the configs say why)
    # and GRPO with the what-if updates of TR-GRPO and Lopti every 5 steps (the What if page)
    | {f"lab_grpo_{extra}": (f"lab_add_grpo_{extra}.toml", {}) for extra in ("rollout", "entropy", "whatif")}
)

STUDY_RUNS = {f"lab_{r}" for r in RULE_PARAMS}  # the study's seed-0 configs (--from-study copies these)
SIZE_LIMIT_MB = 30.0  # the committed sample_runs/ folder, all runs together
DEMO_RUN = "smollm_grpo"  # copied to tokengrad/demo: the run the dashboard opens where there are none


def make_run(name: str, out: Path, overrides: dict) -> tuple[Path, float]:
    """Train run `name` into out/<name> (replacing an old run there); returns (run_dir, seconds)."""
    if name not in RUNS:
        raise ValueError(f"unknown sample run {name!r}; known: {sorted(RUNS)}")
    config, fixed = RUNS[name]
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    tokengrad.train.run(
        str(ROOT / "configs" / config), run_dir=str(run_dir), run_name=name, **(fixed | overrides)
    )
    shutil.rmtree(checkpoint_path(run_dir), ignore_errors=True)
    return run_dir, time.perf_counter() - t0


def copy_study_run(name: str, study: Path, out: Path) -> Path:
    """out/<name> as a copy of the study's seed-0 run of the same config (scripts/study.py trains
    configs/lab_add_<rule>.toml with seed 0 exactly as make_run does), relabelled with the sample name."""
    config, fixed = RUNS[name]
    rule = config.removeprefix("lab_add_").removesuffix(".toml")
    src = study / f"{rule}-s0"
    meta = json.loads((src / "meta.json").read_text()) if (src / "meta.json").exists() else {}
    if not (name in STUDY_RUNS and meta.get("finished") and meta["config"]["seed"] == 0):
        raise SystemExit(f"{src} is not a finished seed-0 study run of {config}")
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(src, run_dir, ignore=shutil.ignore_patterns("study.json", "checkpoint"))
    meta["run_name"] = meta["config"]["run_name"] = name
    meta["config"]["run_dir"] = str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir)
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return run_dir


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "sample_runs", help="folder of the runs")
    ap.add_argument("--only", nargs="+", default=list(RUNS), choices=sorted(RUNS), help="runs to (re)make")
    ap.add_argument(
        "--from-study",
        type=Path,
        default=None,
        help="copy the lab_<rule> runs from this finished "
        "study folder (its seed-0 runs are the same configs and seed) instead of training them",
    )
    ap.add_argument("--steps", type=int, default=None, help="override the config's steps (quick looks)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: deterministic and fastest on a shared machine)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {"progress": False} | ({"steps": args.steps} if args.steps else {})
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        if args.from_study and name in STUDY_RUNS:  # the lab-add study's configs
            print(f"{copy_study_run(name, args.from_study, args.out)}: copied from {args.from_study}")
            continue
        run_dir, seconds = make_run(name, args.out, overrides)
        print(f"{run_dir}: {seconds / 60:.1f} min, {folder_mb(run_dir):.1f} MB", flush=True)
        if name == DEMO_RUN and args.out == ROOT / "sample_runs" and not args.steps:
            shutil.rmtree(DEMO_ROOT / name, ignore_errors=True)  # the package's demo is this run's copy
            shutil.copytree(run_dir, DEMO_ROOT / name)
    total = folder_mb(args.out)
    print(f"{args.out}: {total:.1f} MB in all (limit {SIZE_LIMIT_MB:.0f} MB)")
    return 0 if total <= SIZE_LIMIT_MB else 1


if __name__ == "__main__":
    sys.exit(main())
