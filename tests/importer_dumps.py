"""Small dumps in the layouts other frameworks write (tokengrad.importers reads them), with values computed
from a real softmax so that the imported numbers can be checked against them.

prime-rl: token_exports/step_<s>/rank_<r>.jsonl, records as prime_rl/trainer/rl/token_export.py writes them
(schema_version 1; ratio, mismatch_kl = ratio - log ratio - 1 and prob_delta as its loss.py computes them).
NeMo-RL: train_data_step<N>.jsonl as logger.log_batched_dict_as_jsonl writes a batch: one line per sample,
every field a one-element list, per-token arrays padded to the batch's longest sequence.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

VOCAB = 11


def sequence(seed: int, n: int) -> dict[str, list]:
    """Token ids sampled from a random softmax, their log-probs and the distribution's entropy."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, VOCAB, generator=g, dtype=torch.float64) * 2  # [T, V]
    logp = torch.log_softmax(logits, -1)  # [T, V]
    ids = torch.multinomial(logp.exp(), 1, generator=g).squeeze(-1)  # [T]
    lp = logp.gather(-1, ids[:, None]).squeeze(-1)  # [T]
    entropy = -(logp.exp() * logp).sum(-1)  # [T]
    noise = torch.randn(n, generator=g, dtype=torch.float64) * 0.02  # [T] engine vs trainer
    return {"ids": ids.tolist(), "lp": lp.tolist(), "mu": (lp + noise).tolist(), "entropy": entropy.tolist()}


def prime_record(step: int, rank: int, idx: int, seed: int, prompt: int = 3, completion: int = 5) -> dict:
    """One exported sequence: `prompt` tokens outside the loss, then a completion whose third token is
    tool output (outside the loss mask, inference log-prob 0 as the engine did not sample it)."""
    s = sequence(seed, prompt + completion)
    loss = [False] * prompt + [True] * completion
    loss[prompt + 2] = False
    mu = [m if keep else 0.0 for m, keep in zip(s["mu"], loss)]
    adv = 0.5 - 0.25 * idx
    log_ratio = [t - m for t, m in zip(s["lp"], mu)]
    prob_delta = [math.exp(t) - math.exp(m) for t, m in zip(s["lp"], mu)]
    high, low = 0.2, 0.2  # DefaultLossConfig dppo_mask_high / dppo_mask_low
    invalid = [(d > high) if adv > 0 else (d < -low) for d in prob_delta]
    return {
        "schema_version": 1,
        "step": step,
        "rank": rank,
        "micro_step": idx % 2,
        "micro_sequence_idx": idx,
        "export_sequence_idx": idx,
        "env_name": "letters",
        "token_ids": s["ids"],
        "position_ids": list(range(prompt + completion)),
        "loss_mask": loss,
        "advantages": [adv] * (prompt + completion),
        "inference_logprobs": mu,
        "trainer_logprobs": s["lp"],
        "entropy": s["entropy"],
        "mismatch_kl": [math.exp(x) - x - 1 for x in log_ratio],
        "log_importance_ratio": log_ratio,
        "importance_ratio": [math.exp(x) for x in log_ratio],
        "prob_delta": prob_delta,
        "is_masked": [m and i for m, i in zip(loss, invalid)],
        "is_masked_high": [m and i and adv > 0 for m, i in zip(loss, invalid)],
        "is_masked_low": [m and i and adv < 0 for m, i in zip(loss, invalid)],
        "rl_weights": None,
        "ce_weights": None,
        "ref_kl_weights": None,
    }


def write_prime_rl(root: Path, steps=(1, 2), ranks=(0, 1), per_rank: int = 2) -> dict[tuple, dict]:
    """A token export under root/token_exports; returns (step, rank, idx) -> record."""
    out = {}
    for step in steps:
        folder = root / "token_exports" / f"step_{step}"
        folder.mkdir(parents=True)
        for rank in ranks:
            recs = [prime_record(step, rank, i, seed=100 * step + 10 * rank + i) for i in range(per_rank)]
            lines = [json.dumps(r, separators=(",", ":"), allow_nan=False) for r in recs]
            (folder / f"rank_{rank}.jsonl").write_text("\n".join(lines) + "\n")
            out.update({(step, rank, i): r for i, r in enumerate(recs)})
        (folder / "STABLE").touch()
    return out


def nemo_batch(step: int, n_samples: int = 4, prompt: int = 2, lengths=(4, 6, 3, 5)) -> list[dict]:
    """One step's batch as the GRPO loop builds log_data (padded [B, S] arrays), before it is written."""
    width = prompt + max(lengths)
    batch = []  # the engine scores no prompt token: 0 there
    for i in range(n_samples):
        n = prompt + lengths[i]
        s = sequence(1000 * step + i, n)
        pad = width - n
        batch.append(
            {
                "content": [f"prompt {i} | answer {i}"],
                "rewards": [float(i % 2)],
                "input_lengths": [n],
                "token_ids": [s["ids"] + [0] * pad],
                "token_loss_mask": [[0] * prompt + [1] * lengths[i] + [0] * pad],
                "sample_loss_mask": [1.0],
                "advantages": [[0.0] * prompt + [float(i % 2) - 0.5] * lengths[i] + [0.0] * pad],
                # NeMo-RL's convention: position t holds token t's log-prob, the first token 0
                "generation_logprobs": [[0.0] * prompt + s["mu"][prompt:] + [0.0] * pad],
                "prev_logprobs": [[0.0] + s["lp"][1:] + [0.0] * pad],
            }
        )
    return batch


def write_nemo_rl(root: Path, steps=(1, 2)) -> dict[int, list[dict]]:
    out = {}
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        batch = nemo_batch(step)
        lines = [json.dumps({**rec, "idx": i}) for i, rec in enumerate(batch)]
        (root / f"train_data_step{step}.jsonl").write_text("\n".join(lines) + "\n")
        out[step] = batch
    return out


def write_trl_completions(root: Path, steps=(1, 2), group: int = 2) -> None:
    """output_dir/completions/completions_<step:05d>.parquet as TRL's GRPOTrainer.log writes them: two
    prompts of `group` completions each, one reward function, its group-relative advantage."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "completions"
    folder.mkdir(parents=True, exist_ok=True)
    for step in steps:
        n = 2 * group
        reward = [float((step + i) % 3) / 2 for i in range(n)]
        mean = [sum(reward[g * group : (g + 1) * group]) / group for g in range(2)]
        table = {
            "step": [str(step)] * n,
            "prompt": [f"prompt {i // group}" for i in range(n)],
            "completion": [f"answer {step}.{i}" for i in range(n)],
            "accuracy": reward,
            "advantage": [r - mean[i // group] for i, r in enumerate(reward)],
        }
        pq.write_table(pa.table(table), folder / f"completions_{step:05d}.parquet")
