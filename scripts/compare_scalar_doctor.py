"""`tokengrad doctor` side by side with a scalar-only run doctor (rldoctor) on the same runs.

    python -m venv /tmp/rldoc && /tmp/rldoc/bin/pip install rldoctor==0.2.0     # a scratch environment
    python scripts/compare_scalar_doctor.py sample_runs/* --rldoctor /tmp/rldoc/bin/rldoctor
    python scripts/compare_scalar_doctor.py RUN ... --rldoctor ... --markdown docs_table.md

rldoctor is not a dependency: it reads a JSONL of per-step scalars, so each run's scalars are written in
the field names it documents (`rldoctor fields`): reward_mean/std, entropy, kl, clip_ratio, grad_norm,
lr, policy_loss, step_time, response_length (mean completion tokens), truncation_rate (completions at
max_new_tokens without an end token, as tokengrad's truncation detector counts them),
frac_reward_zero_std (groups whose rewards tie), num_generations and eval_score (the held-out accuracy,
on the steps it was measured). Both doctors then run on the same run; the table lists each one's
warnings and critical findings per run, and how many tokens or samples ours names.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokengrad import load_run  # noqa: E402
from tokengrad.doctor.detect_outputs import truncated_completions  # noqa: E402
from tokengrad.doctor.view import RunView  # noqa: E402

# our steps column -> rldoctor's field name (`rldoctor fields` lists the aliases it reads)
STEP_FIELDS = {
    "reward_mean": "reward_mean",
    "reward_std": "reward_std",
    "entropy_mean": "entropy",
    "kl": "kl",
    "clip_frac": "clip_ratio",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "loss": "policy_loss",
    "time_step": "step_time",
}


def scalar_log(run) -> pd.DataFrame:
    """One row per step with the scalars a scalar doctor reads (rank 0's view; the grad norm is global)."""
    steps = run.steps.groupby("step").agg({c: "mean" for c in STEP_FIELDS if c in run.steps})
    out = steps.rename(columns=STEP_FIELDS)
    cfg = run.meta.get("config", {})
    s = run.samples
    if len(s):
        out["response_length"] = s.groupby("step")["length"].mean()
        view = RunView(run)
        if view.max_new_tokens:  # the truncation detector's definition: at the limit without an end token
            flags, _ = truncated_completions(view, view.max_new_tokens)
            out["truncation_rate"] = flags.groupby("step")["truncated"].mean()
        tied = s.groupby(["step", "group_id"])["reward"].agg(lambda r: r.nunique() == 1)
        out["frac_reward_zero_std"] = tied.groupby("step").mean()
    if cfg.get("group_size"):
        out["num_generations"] = cfg["group_size"]
    e = run.evals
    if len(e):
        acc = (e["accuracy"] * e["n"]).groupby(e["step"]).sum() / e["n"].groupby(e["step"]).sum()
        out["eval_score"] = acc.rename(index=lambda k: max(int(k), 0))  # step -1: before the first update
    return out.reset_index()


def write_jsonl(frame: pd.DataFrame, path: Path) -> None:
    rows = [{k: v for k, v in r.items() if pd.notna(v)} for r in frame.to_dict("records")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def theirs(rldoctor: str, log: Path) -> list[dict]:
    """rldoctor's findings on the log that are more than OK or SKIPPED (a detector without its fields)."""
    out = subprocess.run([rldoctor, "diagnose", str(log), "-f", "json"], capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(f"rldoctor failed on {log}: {out.stderr[-1000:]}")
    found = json.loads(out.stdout)["findings"]
    return [f for f in found if str(f["severity"]).upper() not in ("OK", "SKIPPED")]


def ours(run_dir: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "tokengrad.cli", "doctor", str(run_dir), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"tokengrad doctor failed on {run_dir}: {out.stderr[-1000:]}")
    return json.loads(out.stdout)["findings"]


def describe_ours(findings: list[dict]) -> str:
    """One entry per finding id: severity (the highest), how many, their steps, tokens/samples named."""
    parts = []
    for fid in dict.fromkeys(f["id"] for f in findings):
        fs = [f for f in findings if f["id"] == fid]
        sev = max((f["severity"] for f in fs), key=["info", "warning", "critical"].index)
        steps = ", ".join(_span(f["first_step"], f["last_step"]) for f in fs)
        named = sum(len(f.get("tokens") or []) for f in fs)
        tail = f"; {named} tokens/samples named)" if named else ")"
        parts.append(f"{fid} ×{len(fs)} ({sev}; steps {steps}{tail}")
    return "; ".join(parts) or "none"


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def describe_theirs(findings: list[dict]) -> str:
    line = "{detector} ({sev}): {summary}"
    return "; ".join(line.format(sev=str(f["severity"]).lower(), **f) for f in findings) or "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--rldoctor", required=True, help="the rldoctor executable of a scratch environment")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    lines = ["| run | rldoctor 0.2.0 | tokengrad doctor |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for run_dir in args.runs:
            log = Path(tmp) / f"{run_dir.name}.jsonl"
            write_jsonl(scalar_log(load_run(run_dir)), log)
            them, us = describe_theirs(theirs(args.rldoctor, log)), describe_ours(ours(run_dir))
            lines.append(f"| {run_dir.name} | {them} | {us} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
