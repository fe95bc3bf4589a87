"""prime-rl's trainer token export (`trainer.enable_token_export = true`, PR #2592; read from
src/prime_rl/trainer/rl/token_export.py, export schema_version 1).

Layout: `<output_dir>/token_exports/step_<step>/rank_<rank>.jsonl`, one JSON record per exported sequence
(a packed sample: prompt and completion tokens, `loss_mask` marking the trained ones), with aligned per-token
arrays `token_ids, position_ids, loss_mask, advantages, inference_logprobs, trainer_logprobs, entropy` and,
where the loss computed them, `mismatch_kl, log_importance_ratio, importance_ratio, prob_delta, is_masked,
is_masked_high, is_masked_low, rl_weights, ce_weights, ref_kl_weights` (null otherwise); `step, rank,
micro_step, micro_sequence_idx, export_sequence_idx, env_name` per record. A `STABLE` file marks a step
folder every rank has finished. Non-finite floats are written as null.

prime-rl's importance ratio is trainer against inference log-probs (there is no separate pi_old), so
old_logprob, ratio and the rollout gap metrics stay null; the export holds no reward, group, prompt text or
token text.
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

LAYOUT_VERSION = 1
REQUIRED = ("schema_version", "step", "rank", "token_ids", "loss_mask", "advantages", "inference_logprobs")
REQUIRED_TOKENS = ("trainer_logprobs", "entropy")
# per-token fields kept as extra token columns under prime-rl's own names, when the loss computed them
EXTRA = ("mismatch_kl", "importance_ratio", "prob_delta", "rl_weights", "ce_weights", "ref_kl_weights")
_STEP_DIR = re.compile(r"^step_(\d+)$")
_RANK_FILE = re.compile(r"^rank_(\d+)\.jsonl$")


@register_importer("prime_rl")
def import_prime_rl(src: Path, out: Path, group_size: int | None = None) -> dict:
    """prime-rl token export (token_exports/step_*/rank_*.jsonl): tokens, samples without rewards, steps."""
    root = _exports_dir(src)
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    if not steps:
        raise ValueError(f"{root} holds no step_<n> folders of a prime-rl token export")
    ranks = {int(m.group(1)) for _, d in steps for f in d.iterdir() if (m := _RANK_FILE.match(f.name))}
    unstable = [s for s, d in steps if not (d / "STABLE").exists()]
    with RunSink(
        out,
        _provenance(root, unstable),
        world_size=max(ranks, default=0) + 1,
        config={"imported_from": "prime_rl", "group_size": group_size},
    ) as sink:
        for step, folder in steps:
            _import_step(sink, step, folder, group_size)
        return sink.close()


def _exports_dir(src: Path) -> Path:
    for candidate in (src, src / "token_exports"):
        if candidate.is_dir() and any(_STEP_DIR.match(p.name) for p in candidate.iterdir()):
            return candidate
    raise ValueError(
        f"{src} is not a prime-rl token export: expected step_<n>/rank_<r>.jsonl folders in it or in its "
        "token_exports/ folder (written with trainer.enable_token_export = true)"
    )


def _provenance(root: Path, unstable: list[int]) -> Provenance:
    notes = [
        "prime-rl records no reward, prompt group, prompt or token text; group_id is the sample's own "
        "id unless group_size is given"
    ]
    if unstable:
        notes.append(f"steps without a STABLE marker (a rank may not have finished writing): {unstable}")
    return Provenance(
        format="prime_rl",
        source=str(root),
        source_layout=f"prime-rl token export, schema_version {LAYOUT_VERSION}",
        derived={
            "prob": "exp(logprob)",
            "logprob": "trainer_logprobs",
            "rollout_logprob": "inference_logprobs on loss tokens (null outside the loss mask)",
            "masked": "is_masked (DPPO's prob_delta bounds), reason is_token_mask",
            "pass_id": "micro_step",
            "samples.task": "env_name",
        },
        notes=notes,
    )


def _records(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("rank_*.jsonl"), key=lambda p: int(_RANK_FILE.match(p.name).group(1))):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                rec = json.loads(line)
                require(rec, ("schema_version",), f"{path} line {n}")
                if rec["schema_version"] != LAYOUT_VERSION:
                    raise ValueError(
                        f"{path} line {n} has export schema_version {rec['schema_version']!r}; this importer "
                        f"reads version {LAYOUT_VERSION}"
                    )
                require(rec, REQUIRED + REQUIRED_TOKENS, f"{path} line {n}")
                out.append(rec)
    return out


def _import_step(sink: RunSink, step: int, folder: Path, group_size: int | None) -> None:
    records = _records(folder)
    groups = group_ids(len(records), group_size)
    by_rank: dict[int, tuple[dict, dict]] = {}
    for sample_id, rec in enumerate(records):
        tokens, samples = by_rank.setdefault(int(rec["rank"]), ({}, {}))
        _add_record(tokens, samples, rec, (sample_id, groups[sample_id]), f"{folder} record {sample_id}")
    all_tokens: dict[str, list] = {}
    for tokens, _ in by_rank.values():
        for k, v in tokens.items():
            all_tokens.setdefault(k, []).extend(v)
    for i, (rank, (tokens, samples)) in enumerate(sorted(by_rank.items())):
        steps = step_row(all_tokens, None) if i == 0 else None  # the step's row once, over every rank
        sink.write(step, rank, tokens=tokens, samples=samples, steps=steps)


def _add_record(tokens: dict, samples: dict, rec: dict, ids: tuple[int, int], where: str) -> None:
    loss = rec["loss_mask"]
    n = len(rec["token_ids"])
    per_token = {
        k: rec.get(k) for k in (*REQUIRED_TOKENS, "advantages", "inference_logprobs", "is_masked", *EXTRA)
    }
    aligned({**per_token, "loss_mask": loss}, n, where)
    start = completion_span(loss, where)
    masked = rec.get("is_masked")
    trainer = rec["trainer_logprobs"]
    columns = {
        "logprob": trainer,
        "prob": [None if x is None else math.exp(x) for x in trainer],
        "entropy": rec["entropy"],
        "advantage": rec["advantages"],
        "rollout_logprob": [x if m else None for x, m in zip(rec["inference_logprobs"], loss)],
        "masked": masked,
        "masked_by": None if masked is None else ["is_token_mask" if m else None for m in masked],
        **{k: rec.get(k) for k in EXTRA},
    }
    add_sequence(
        tokens,
        (*ids, int(rec.get("micro_step", 0))),
        token_ids=rec["token_ids"],
        loss_mask=loss,
        per_token=columns,
        start=start,
    )
    adv = {a for a, m in zip(rec["advantages"], loss) if m}
    for key, value in (
        ("sample_id", ids[0]),
        ("group_id", ids[1]),
        ("length", n - start),
        ("advantage", adv.pop() if len(adv) == 1 else None),  # a sequence advantage only where it is one
        ("task", rec.get("env_name")),
    ):
        samples.setdefault(key, []).append(value)
