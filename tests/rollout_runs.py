"""Runs with a real rollout gap, for the read-side, figure and dashboard tests of the rollout view.

    write_gap_run(tmp / "gap")        # 2 completions x 3 tokens with hand-chosen gaps (values in the test)
    train_gap_run(tmp / "tiny")       # the built-in trainer with a top-p sampler at T = 0.1 and token_mask

The hand-made run's numbers are listed in HAND: the tests compute every expected value from them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from letters_task import LettersTask  # noqa: F401  (registers the "letters" task)
from synthetic_runs import _table, _write, write_meta

# per token: (sample, position, log pi_old, log mu (None: not scored), update_share, masked)
HAND = [
    (0, 0, -1.0, -1.05, 0.1, False),
    (0, 1, -2.0, -2.5, 0.5, False),
    (0, 2, -0.5, -0.5, 0.05, False),
    (1, 0, -0.1, -0.3, 0.0, True),
    (1, 1, -3.0, None, 0.0, True),
    (1, 2, -1.0, -0.2, 0.0, True),
]
SAMPLES = {0: dict(reward=1.0, advantage=0.7), 1: dict(reward=0.0, advantage=-0.7)}


def write_gap_run(run: str | Path) -> Path:
    """One step, one update, two completions: sample 1 removed by the sequence mask."""
    run = Path(run)
    run.mkdir(parents=True)
    write_meta(run, run.name, n_steps=1, bucket_every=0)
    sid = np.array([t[0] for t in HAND])
    old = np.array([t[2] for t in HAND])
    mu = np.array([np.nan if t[3] is None else t[3] for t in HAND])
    masked = np.array([t[5] for t in HAND])
    n = len(HAND)
    tokens = {
        "step": np.zeros(n, int),
        "rank": np.zeros(n, int),
        "update_id": np.zeros(n, int),
        "pass_id": np.zeros(n, int),
        "sample_id": sid,
        "group_id": np.zeros(n, int),
        "position": np.array([t[1] for t in HAND]),
        "token_id": np.arange(n),
        "token": [f"t{i}" for i in range(n)],
        "in_loss": np.ones(n, bool),
        "logprob": old,
        "old_logprob": old,
        "rollout_logprob": [None if np.isnan(x) else x for x in mu],  # null, as the recorder writes it
        "prob": np.exp(old),
        "update_share": np.array([t[4] for t in HAND]),
        "coef": np.where(masked, 0.0, -0.3),
        "logit_grad_norm": np.where(masked, 0.0, 0.3),
        "is_weight": np.where(masked, 0.0, 1.2),
        "masked": masked,
        "masked_by": ["is_sequence_mask" if m else None for m in masked],
        "advantage": np.array([SAMPLES[s]["advantage"] for s in sid]),
    }
    _write(run, "tokens", _table("tokens", tokens), 0, 0)
    d = np.nan_to_num(old - mu, nan=0.0)
    samples = {
        "step": [0, 0],
        "rank": [0, 0],
        "sample_id": [0, 1],
        "group_id": [0, 0],
        "prompt": ["p", "p"],
        "completion": ["a", "b"],
        "reward": [SAMPLES[0]["reward"], SAMPLES[1]["reward"]],
        "advantage": [SAMPLES[0]["advantage"], SAMPLES[1]["advantage"]],
        "length": [3, 3],
        "rollout_seq_log_ratio": [d[sid == 0].sum(), d[sid == 1].sum()],
        "rollout_gap_mean": [d[sid == 0].mean(), d[sid == 1][[0, 2]].mean()],
    }
    _write(run, "samples", _table("samples", samples), 0, 0)
    scored = ~np.isnan(mu)
    steps = {
        "step": [0],
        "rank": [0],
        "grad_norm": [0.25],
        "rollout_mismatch": [float(np.abs(old - mu)[scored].mean())],
        "rollout_mismatch_max": [float(np.abs(old - mu)[scored].max())],
    }
    _write(run, "steps", _table("steps", steps), 0, 0)
    return run


def train_gap_run(run: str | Path, steps: int = 2) -> Path:
    """The built-in trainer, tiny model: a sharp sampler (T = 0.1) with top-p 0.8, so the engine's log-prob
    exceeds the trainer's on every sampled token by the nucleus's missing mass, and token_mask at C_min =
    exp(-0.2): tokens with d < -0.2 leave the gradient. Attribution on every step."""
    from tokengrad.train.trainer import train

    return train(
        dict(
            model="tiny",
            task="letters",
            task_params={"noisy": True},  # random rewards: equal completions of a sharp sampler still differ
            steps=steps,
            prompts_per_step=4,
            group_size=4,
            max_new_tokens=8,
            lr=1e-2,
            temperature=0.1,
            top_p=0.8,
            attribute_every=1,
            rollout_correction="token_mask",
            rollout_correction_clip_min=float(np.exp(-0.2)),
            progress=False,
            checkpoint=False,
            run_dir=str(run),
        )
    )
