"""A small study: token-weighting rules x seeds on one config, summarised in one table.

    python scripts/study.py                                   # configs/sample_study.toml, 3 rules x 3 seeds
    python scripts/study.py --seeds 0 1 2 3 4 --out runs/study5 --table docs/study5.md
    python scripts/study.py --table-only                      # re-summarise finished runs, train nothing
    python scripts/study.py --table-only --out sample_runs --name {rule} --seeds 0   # the sample runs' row
    python scripts/study.py --set model=tiny steps=4 --out /tmp/study_smoke   # a smoke run of the pipeline

Each (rule, seed) trains into OUT/<rule>-s<seed> (--name); a finished run there is reused, so an interrupted
study continues where it stopped. The table (markdown, printed and written to --table) has one row per rule
with the mean and standard deviation over seeds of the following ("(n=k)": only k seeds have a value, e.g.
a seed whose analysed steps all had zero gradient has no low_update):

    final_reward      mean reward over the last 10% of steps (tokengrad.figures.summary.final_value)
    mean_reward       mean reward over all steps
    eval_d<k>         greedy held-out accuracy at the last evaluation, difficulty k (digits, people, ...)
    grad_norm_cv      std / mean of the pre-clip total gradient norm per step
                      (summary.coefficient_of_variation)
    grad_norm_cv_signal  the same over the steps with a gradient (grad_norm > 0, see zero_steps)
    spikes            gradient-norm spikes, robust z-score > 3.5 (summary.summarize_run / find_spikes)
    zero_steps        steps whose every group had equal rewards: no advantage, zero gradient
    low_tokens        share of loss tokens with probability < 0.25 (every step, tokens table)
    low_update        that bucket's share of the update, <g_B, g> / |g|^2 (bucket analysis steps)
    low_logit_grad    its share of the summed per-token logit-gradient norms (every step, tokens table)

Rule parameters are the ones of the sample runs (scripts/make_sample_runs.py RULES).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_sample_runs import RULES  # noqa: E402

import tokengrad  # noqa: E402
from tokengrad import load_run  # noqa: E402
from tokengrad.figures.summary import coefficient_of_variation, summarize_run  # noqa: E402
from tokengrad.train.checkpoint import checkpoint_path  # noqa: E402
from tokengrad.train.config import parse_override  # noqa: E402

CONFIG = ROOT / "configs" / "sample_study.toml"
LOW_EDGE = 0.25  # the lowest probability bucket of the default edges [0, .25, .5, .75, 1]
METRICS = (
    "final_reward",
    "mean_reward",
    "grad_norm_cv",
    "grad_norm_cv_signal",
    "spikes",
    "zero_steps",
    "low_tokens",
    "low_update",
    "low_logit_grad",
)


def run_one(rule: str, seed: int, run_dir: Path, config: Path, overrides: dict) -> Path:
    """Train (rule, seed) into run_dir unless a finished run is already there; returns run_dir."""
    meta = run_dir / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("finished"):
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    tokengrad.train(
        str(config),
        weighting=rule,
        weighting_params=RULES[rule],
        seed=seed,
        run_dir=str(run_dir),
        run_name=f"{rule}-s{seed}",
        **({"progress": False} | overrides),
    )
    shutil.rmtree(checkpoint_path(run_dir), ignore_errors=True)
    return run_dir


def low_bucket_shares(run) -> dict:
    """The lowest probability bucket's share of the loss tokens and of the gradient.

    low_tokens and low_logit_grad come from the tokens table (all steps; a Lopti step's two passes hold
    each loss token once between them). low_update combines a step's updates u (Lopti makes two) as
    sum_u <g_B,u, g_u> / sum_u |g_u|^2 over the bucket steps, which is the bucket analysis' update_share
    when there is one update; |g_u| is the layers table's total pre-clip norm."""
    t = run.sql(
        f"SELECT count(*) FILTER (WHERE prob < {LOW_EDGE}) AS n_low, count(*) AS n, "
        f"sum(logit_grad_norm) FILTER (WHERE prob < {LOW_EDGE}) AS g_low, sum(logit_grad_norm) AS g "
        "FROM tokens WHERE in_loss"
    ).iloc[0]
    out = {
        "low_tokens": float(t["n_low"]) / float(t["n"]) if t["n"] else float("nan"),
        "low_logit_grad": float(t["g_low"] or 0.0) / float(t["g"]) if t["g"] else float("nan"),
    }
    b, lay = run.buckets, run.layers
    low = b[(b["lo"] == 0.0) & (b["hi"] <= LOW_EDGE + 1e-6)] if len(b) else b
    total = (
        lay[lay["layer"] == "total"].groupby(["step", "update_id"])["grad_norm"].max() if len(lay) else None
    )
    if len(low) and total is not None:
        g2 = total.reindex(list(zip(low["step"], low["update_id"]))).to_numpy() ** 2  # |g_u|^2 per bucket row
        share = low["update_share"].to_numpy()  # NaN where the update had no gradient
        num, den = np.nansum(share * g2), np.nansum(np.where(np.isfinite(share), g2, 0.0))
        out["low_update"] = float(num / den) if den > 0 else float("nan")
    else:
        out["low_update"] = float("nan")
    return out


def run_row(run_dir: Path) -> dict:
    """One run's metrics: the dashboard summary's definitions plus the study's own columns."""
    run = load_run(run_dir)
    s = summarize_run(run.name, run.meta, run.steps, run.layers, run.evals)
    steps = run.steps.groupby("step").agg(reward=("reward_mean", "mean"), std=("reward_std", "max"))
    row = {
        "rule": s["rule"],
        "seed": int(run.meta["config"]["seed"]),
        "final_reward": s["final_reward"],
        "mean_reward": float(steps["reward"].mean()),
        "grad_norm_cv": s["grad_norm_cv"],
        "grad_norm_cv_signal": coefficient_of_variation(
            run.steps.loc[run.steps["grad_norm"] > 0, "grad_norm"]
        ),
        "spikes": s["spikes"],
        "zero_steps": int((steps["std"] == 0).sum()),
        **low_bucket_shares(run),
    }
    ev = run.evals
    if len(ev):
        last = ev[ev["step"] == ev["step"].max()]
        row |= {f"eval_d{d}": float(a) for d, a in zip(last["difficulty"], last["accuracy"])}
    return row


def study_table(rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per rule: 'mean ± std' over the seeds where the metric exists, '(n=k)' when only k of them do;
    per run: the raw rows), both with the columns in METRICS order then eval_d*."""
    df = pd.DataFrame(rows)
    metrics = [m for m in METRICS if m in df] + sorted(c for c in df if c.startswith("eval_d"))
    out = []
    for rule, g in df.groupby("rule", sort=False):
        cells = {"rule": rule, "seeds": len(g)}
        for m in metrics:
            v = g[m].astype(float).dropna()
            partial = f" (n={len(v)})" if len(v) < len(g) else ""
            cells[m] = "n/a" if v.empty else f"{v.mean():.3f} ± {v.std(ddof=0):.3f}{partial}"
        out.append(cells)
    return pd.DataFrame(out), df[["rule", "seed", *metrics]].sort_values(["rule", "seed"])


def markdown(df: pd.DataFrame) -> str:
    """A pipe table; floats in 3 decimals (pandas' to_markdown needs the optional tabulate package)."""
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=sorted(RULES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "study")
    ap.add_argument("--name", default="{rule}-s{seed}", help="run folder name under --out")
    ap.add_argument("--table", type=Path, default=None, help="also write the markdown table here")
    ap.add_argument("--table-only", action="store_true", help="summarise the runs in --out, train nothing")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: deterministic)")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for every run, e.g. --set steps=4 model=tiny",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = dict(parse_override(item) for item in args.set)
    rows = []
    for seed in args.seeds:  # seed-major: an interrupted study has every rule at the early seeds
        for rule in args.rules:
            run_dir = args.out / args.name.format(rule=rule, seed=seed)
            if not args.table_only:
                run_one(rule, seed, run_dir, args.config, overrides)
                print(f"finished {run_dir}", flush=True)
            if (run_dir / "meta.json").exists():
                rows.append(run_row(run_dir))
    if not rows:
        raise SystemExit(f"no runs under {args.out}")
    table, per_run = study_table(rows)
    text = f"{markdown(table)}\n\nPer run:\n\n{markdown(per_run)}\n"
    print(text)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
