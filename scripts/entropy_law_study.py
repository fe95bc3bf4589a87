"""The entropy law of arXiv 2602.03392 per token on the lab model, over a sweep of learning rates.

    python scripts/entropy_law_study.py                         # 7 lrs x 3 seeds -> runs/entropy_law
    python scripts/entropy_law_study.py --lrs 3e-5 1e-3 --seeds 0 1 2 --steps 20
    python scripts/entropy_law_study.py --table-only            # re-summarise finished runs

Every (lr, seed) trains configs/lab_add_grpo_entropy.toml (GRPO on lab-add, AdamW, fp32) for --steps
steps with entropy attribution every --every steps and no evaluation, into OUT/lr<lr>-s<seed> (a finished
run there is reused). Per run, pooled over its attributed updates with a gradient
(tokengrad.read.entropy_queries.entropy_law / law_fit): the law's prediction -eps S* (eps = dlogprob /
(1 - p), S* = p (H + log p)) against the measured per-token entropy change `dentropy` (Pearson, Spearman,
least-squares slope, sign agreement), and the exact first-order prediction `dentropy_pred` against the
same (the reference: where its slope leaves 1, first order itself breaks). Summary: mean over seeds with a
percentile bootstrap 95 % interval resampling seeds (scripts/study_report.bootstrap_ci), printed as a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:  # run as a script from a checkout
        sys.path.insert(0, str(p))

from study_report import bootstrap_ci  # noqa: E402

import tokengrad  # noqa: E402
from tokengrad import load_run  # noqa: E402
from tokengrad.read.entropy_law import LAW_PRED, entropy_law, law_fit  # noqa: E402
from tokengrad.schema import TOK  # noqa: E402

CONFIG = ROOT / "configs" / "lab_add_grpo_entropy.toml"
LRS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
STATS = ("pearson", "spearman", "slope", "sign_agree")


def train_one(out: Path, lr: float, seed: int, steps: int, every: int) -> Path:
    run_dir = out / f"lr{lr:g}-s{seed}"
    meta = run_dir / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("finished"):
        return run_dir
    t0 = time.perf_counter()
    over = dict(steps=steps, attribute_every=every, eval_every=0, eval_at_start=False, bucket_every=0)
    tokengrad.train.run(
        str(CONFIG), run_dir=str(run_dir), lr=lr, seed=seed, progress=False, resume=meta.exists(), **over
    )
    print(f"{run_dir}: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def run_stats(run_dir: Path) -> dict[str, float]:
    """law_fit of the law and of dentropy_pred against dentropy, pooled over the run's attributed updates."""
    df = entropy_law(load_run(run_dir))
    law = law_fit(df[LAW_PRED], df[TOK.dentropy])
    first = law_fit(df[TOK.dentropy_pred], df[TOK.dentropy])
    out = {f"law_{k}": law[k] for k in STATS} | {f"first_{k}": first[k] for k in ("pearson", "slope")}
    out["n_tokens"] = law["n"]
    out["abs_dentropy"] = float(df[TOK.dentropy].abs().mean()) if len(df) else np.nan
    return out


def table(per_run: dict[float, list[dict]]) -> str:
    """Markdown: one row per lr, mean [95 % CI over seeds] of each statistic."""
    rng = np.random.default_rng(0)
    keys = [*(f"law_{k}" for k in STATS), "first_pearson", "first_slope", "abs_dentropy"]
    lines = ["| lr | seeds | tokens | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    for lr, rows in sorted(per_run.items()):
        cells = []
        for k in keys:
            m, lo, hi = bootstrap_ci(np.array([r[k] for r in rows]), rng)
            digits = ".2e" if k == "abs_dentropy" else ".3f"
            cells.append(f"{m:{digits}} [{lo:{digits}}, {hi:{digits}}]")
        n = int(sum(r["n_tokens"] for r in rows))
        lines.append(f"| {lr:g} | {len(rows)} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "entropy_law")
    ap.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=2, help="entropy attribution every N steps")
    ap.add_argument("--table-only", action="store_true", help="summarise finished runs, train nothing")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # repeatable, and the fastest on a shared machine
    per_run: dict[float, list[dict]] = {}
    for lr in args.lrs:
        for seed in args.seeds:
            run_dir = args.out / f"lr{lr:g}-s{seed}"
            if not args.table_only:
                run_dir = train_one(args.out, lr, seed, args.steps, args.every)
            if (run_dir / "meta.json").exists():
                per_run.setdefault(lr, []).append(run_stats(run_dir))
    print(table(per_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
