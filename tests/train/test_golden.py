"""Golden two-step runs of the built-in trainer on the tiny model: the steps table's loss, grad_norm and
reward equal stored values, so any change to the training math shows up here as a diff to explain.

After an intended change of the math, regenerate with
    TOKENGRAD_UPDATE_GOLDEN=1 python -m pytest tests/train/test_golden.py
and say in the commit which numbers moved and why.
"""

import json
import math
import os
from pathlib import Path

import letters_task  # noqa: F401  (registers the "letters" task)
import pytest

from tokengrad import load_run
from tokengrad.train.trainer import train

GOLDEN = Path(__file__).parent / "golden" / "trainer_tiny.json"
COLUMNS = ["loss", "grad_norm", "reward_mean"]
# Two rules that exercise different code: plain GRPO with two PPO epochs and gradient accumulation, and
# TR-GRPO's token weights with the token-mean aggregation and a KL term.
RUNS = {
    "grpo": dict(weighting="grpo", num_iterations=2, grad_accum=2),
    "tr_grpo": dict(weighting="tr_grpo", aggregation="dapo", beta=0.05),
}
BASE = dict(
    model="tiny",
    task="letters",
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=8,
    lr=1e-2,
    seed=3,
    temperature=1.0,
    bf16=False,
    progress=False,
    checkpoint=False,
)


def _run(tmp_path, name: str) -> dict[str, list[float]]:
    run = load_run(train(dict(BASE, **RUNS[name], run_dir=str(tmp_path / name))))
    steps = run.steps.sort_values("step")
    return {c: [float(v) for v in steps[c]] for c in COLUMNS}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_steps(tmp_path, name):
    got = _run(tmp_path, name)
    assert all(math.isfinite(v) for vs in got.values() for v in vs), got
    assert got["grad_norm"][0] > 0, "a golden run must have a gradient, or it tests nothing"
    stored = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("TOKENGRAD_UPDATE_GOLDEN"):
        stored[name] = got
        GOLDEN.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")
    assert name in stored, f"no stored values for {name!r}: run with TOKENGRAD_UPDATE_GOLDEN=1"
    for col in COLUMNS:
        assert got[col] == pytest.approx(stored[name][col], rel=1e-4, abs=1e-7), (name, col)
