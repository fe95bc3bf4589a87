"""NeMo-RL's GRPO training-data log (read from nemo_rl/algorithms/grpo.py, the "Log training data" block,
and nemo_rl/utils/logger.py `log_batched_dict_as_jsonl`).

Layout: `<log_dir>/train_data_step<N>.jsonl` for training step N (counted from 1), one JSON line per
completion, written as a batch of one: every field is a one-element list, `idx` the line's index. Fields:
`content` (the conversation's text), `rewards`, `input_lengths` (prompt + completion tokens), `token_ids`,
`token_loss_mask`, `sample_loss_mask`, `advantages`, `generation_logprobs` (the inference engine's),
`prev_logprobs` (the trainer's pi_old); `agent_ref` and `filtered_rewards` where the run has them. The
per-token arrays are padded to the batch's longest sequence and aligned with `token_ids`: position t holds
token t's value (NeMo-RL gives the first token log-prob 0 to keep the length).

The log holds no log-prob with gradient, entropy, loss coefficient or gradient norm; logprob, entropy, coef
and the steps' norms stay null.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tokengrad.importers import register_importer
from tokengrad.importers.aggregate import step_row
from tokengrad.importers.sequences import add_sequence, aligned, completion_span, group_ids, require
from tokengrad.importers.sink import Provenance, RunSink

REQUIRED = (
    "rewards",
    "input_lengths",
    "token_ids",
    "token_loss_mask",
    "advantages",
    "generation_logprobs",
    "prev_logprobs",
)
_FILE = re.compile(r"^train_data_step(\d+)\.jsonl$")


@register_importer("nemo_rl")
def import_nemo_rl(src: Path, out: Path, group_size: int | None = None) -> dict:
    """NeMo-RL GRPO training-data log (train_data_step<N>.jsonl): tokens, samples with rewards, steps."""
    files = sorted((int(m.group(1)), p) for p in _candidates(src) if (m := _FILE.match(p.name)))
    if not files:
        raise ValueError(
            f"{src} holds no train_data_step<N>.jsonl files of a NeMo-RL GRPO log (they are skipped when "
            "env.should_log_nemo_gym_responses is set)"
        )
    config = {"imported_from": "nemo_rl", "group_size": group_size}
    with RunSink(out, _provenance(src), config=config) as sink:
        for step, path in files:
            tokens, samples = _read_step(path, group_size)
            sink.write(step, 0, tokens=tokens, samples=samples, steps=step_row(tokens, samples))
        return sink.close()


def _candidates(src: Path) -> list[Path]:
    return [src] if src.is_file() else sorted(src.rglob("train_data_step*.jsonl"))


def _provenance(src: Path) -> Provenance:
    return Provenance(
        format="nemo_rl",
        source=str(src),
        source_layout="NeMo-RL GRPO train_data_step<N>.jsonl (log_batched_dict_as_jsonl, a line per sample)",
        derived={
            "old_logprob": "prev_logprobs",
            "rollout_logprob": "generation_logprobs on loss tokens (null outside the loss mask)",
            "prob": "exp(old_logprob): the trainer's probability before the update",
            "in_loss": "token_loss_mask and sample_loss_mask",
            "samples.content": "content (the whole conversation's text; prompt and completion are not apart)",
        },
        notes=["group_id is the sample's own id unless group_size (num_generations_per_prompt) is given"],
    )


def _unwrap(rec: dict) -> dict:
    """The one-element lists of a batch-of-one line, unwrapped (idx is a plain int)."""
    return {k: v[0] if isinstance(v, list) and len(v) == 1 else v for k, v in rec.items()}


def _read_step(path: Path, group_size: int | None) -> tuple[dict, dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups = group_ids(len(lines), group_size)
    tokens: dict[str, list] = {}
    samples: dict[str, list] = {}
    for sample_id, raw in enumerate(lines):
        where = f"{path} line {sample_id + 1}"
        require(raw, REQUIRED, where)
        rec = _unwrap(raw)
        n = int(rec["input_lengths"])
        cut = {k: rec[k][:n] for k in REQUIRED[2:]}  # the batch's padding removed
        aligned(cut, n, where)
        sample_mask = bool(rec.get("sample_loss_mask", 1))
        loss = [bool(m) and sample_mask for m in cut["token_loss_mask"]]
        start = completion_span(cut["token_loss_mask"], where)
        old = cut["prev_logprobs"]
        columns = {
            "old_logprob": old,
            "rollout_logprob": [x if m else None for x, m in zip(cut["generation_logprobs"], loss)],
            "prob": [None if x is None else math.exp(x) for x in old],
            "advantage": cut["advantages"],
        }
        add_sequence(
            tokens,
            (sample_id, groups[sample_id], 0),
            token_ids=cut["token_ids"],
            loss_mask=loss,
            per_token=columns,
            start=start,
        )
        adv = {a for a, m in zip(cut["advantages"][start:], loss[start:]) if m}
        _add_sample(samples, rec, (sample_id, groups[sample_id]), adv, n - start)
    return tokens, samples


def _add_sample(samples: dict, rec: dict, ids: tuple[int, int], adv: set, length: int) -> None:
    """One samples row; `adv`: the advantages of its loss tokens (a sequence advantage where it is one)."""
    agent = rec.get("agent_ref")
    for key, value in (
        ("sample_id", ids[0]),
        ("group_id", ids[1]),
        ("reward", rec["rewards"]),
        ("advantage", adv.pop() if len(adv) == 1 else None),
        ("length", length),
        ("task", agent if isinstance(agent, str) else None),
        ("content", rec.get("content") if isinstance(rec.get("content"), str) else None),
        ("sample_loss_mask", int(bool(rec.get("sample_loss_mask", 1)))),
    ):
        samples.setdefault(key, []).append(value)
