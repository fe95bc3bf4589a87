"""TRL's logged completions (GRPOConfig(log_completions=True); read from trl 1.16 GRPOTrainer.log,
grpo_trainer.py ~L3340-3357) and, where a checkpoint kept it, the trainer's logged metrics.

Layout: `<output_dir>/completions/completions_<global_step:05d>.parquet`, one row per completion of the
latest generation batch, columns in this order: `step`, `prompt`, `completion` (text, or a conversation: a
list of {role, content} messages), one column per reward function named by it (its raw reward, NaN where
it returned None), the columns reward functions added through `log_extra`, and `advantage`. A group's G
completions are consecutive rows. `<output_dir>/checkpoint-<n>/trainer_state.json` (transformers'
TrainerState) holds `log_history`: one dict of logged metrics per logging step.

There are no per-token values: the tokens table stays empty and every detector that needs it is not checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq

from tokengrad.importers import register_importer
from tokengrad.importers.aggregate import step_row
from tokengrad.importers.sink import Provenance, RunSink

_FILE = re.compile(r"^completions_(\d+)\.parquet$")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
REQUIRED = ("step", "prompt", "completion", "advantage")
# TRL metric -> steps column (as the TRL attach names them: tokengrad.integrations.trl.logs); every other
# numeric metric becomes trl_<name>
STEP_COLUMNS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "kl": "kl",
    "entropy": "entropy_mean",
    "clip_ratio/region_mean": "clip_frac",
}


@register_importer("trl_completions")
def import_trl_completions(
    src: Path,
    out: Path,
    group_size: int | None = None,
    reward_columns: list[str] | None = None,
    reward_weights: list[float] | None = None,
) -> dict:
    """TRL completions_*.parquet (+ checkpoint trainer_state.json): samples and steps, no tokens."""
    files = _files(src)
    rewards = reward_columns or _reward_columns(files[0][1])
    weights = reward_weights or [1.0] * len(rewards)  # GRPOConfig.reward_weights=None weighs each by 1
    if len(weights) != len(rewards):
        raise ValueError(f"{len(weights)} reward_weights for the {len(rewards)} reward columns {rewards}")
    logged = _logged_metrics(src)
    names = ["reward_" + _column(r) for r in rewards]
    config = {
        "integration": "trl",
        "imported_from": "trl_completions",
        "args": {"num_generations": group_size, "reward_weights": weights},
        "reward_columns": names,
    }
    with RunSink(out, _provenance(src, rewards, weights, logged is not None), config=config) as sink:
        for step, path in files:
            samples = _samples(path, rewards, weights, group_size)
            steps = {**step_row(None, samples), **{k: [v] for k, v in (logged or {}).get(step, {}).items()}}
            sink.write(step, 0, samples=samples, steps=steps)
        return sink.close()


def _files(src: Path) -> list[tuple[int, Path]]:
    if src.is_file():
        m = _FILE.match(src.name)
        return [(int(m.group(1)) if m else 0, src)]
    for folder in (src / "completions", src):
        found = sorted((int(m.group(1)), p) for p in folder.glob("*.parquet") if (m := _FILE.match(p.name)))
        if found:
            return found
    raise ValueError(
        f"{src} holds no completions_<step>.parquet files (TRL writes them to output_dir/completions/ "
        "with log_completions=True)"
    )


def _reward_columns(path: Path) -> list[str]:
    """The columns between `completion` and `advantage` that hold numbers: TRL's reward functions. A
    numeric column a reward function added with log_extra cannot be told apart: name the reward columns
    (reward_columns=) for such runs."""
    fields = pq.read_schema(path)
    missing = [c for c in REQUIRED if c not in fields.names]
    if missing:
        raise ValueError(
            f"{path} lacks the column(s) {missing} of TRL's completions table; it has {fields.names}"
        )
    between = fields.names[fields.names.index("completion") + 1 : fields.names.index("advantage")]
    numeric = [n for n in between if str(fields.field(n).type) in ("double", "float", "int64", "int32")]
    if not numeric:
        raise ValueError(f"{path} has no numeric column between completion and advantage: no reward function")
    return numeric


def _text(value) -> str | None:
    """A prompt or completion as text: a conversation becomes one 'role: content' line per message."""
    if value is None or isinstance(value, str):
        return value
    lines = []
    for msg in value:
        content = msg.get("content")
        if isinstance(content, list):  # content blocks: text kept, an image stands as [image]
            content = "".join(b.get("text") or f"[{b.get('type')}]" for b in content)
        lines.append(f"{msg.get('role')}: {content}")
    return "\n".join(lines)


def _samples(path: Path, rewards: list[str], weights: list[float], group_size: int | None) -> dict:
    rows = pq.read_table(path).to_pylist()
    missing = [c for c in (*REQUIRED, *rewards) if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {missing}")
    prompts = [_text(r["prompt"]) for r in rows]
    groups = _groups(prompts, group_size, path)
    out: dict[str, list] = {"sample_id": list(range(len(rows))), "group_id": groups, "prompt": prompts}
    out["completion"] = [_text(r["completion"]) for r in rows]
    out["advantage"] = [r["advantage"] for r in rows]
    out["reward"] = [_weighted(r, rewards, weights) for r in rows]
    for name in rewards:
        out["reward_" + _column(name)] = [r[name] for r in rows]
    return out


def _weighted(row: dict, rewards: list[str], weights: list[float]) -> float | None:
    """TRL's reward: the weighted sum of the functions' rewards, None ones left out (nansum); None where
    every function returned None (an unscorable completion)."""
    values = [(row[n], w) for n, w in zip(rewards, weights) if row[n] is not None and row[n] == row[n]]
    return sum(v * w for v, w in values) if values else None


def _groups(prompts: list, group_size: int | None, path: Path) -> list[int]:
    """Group ids: consecutive runs of group_size rows, or, without it, runs of one prompt (TRL's sampler
    lays each prompt's completions next to each other)."""
    if group_size is not None:
        if group_size < 1 or len(prompts) % group_size:
            raise ValueError(
                f"{path} holds {len(prompts)} completions, not a multiple of group_size {group_size}"
            )
        return [i // group_size for i in range(len(prompts))]
    out, g = [], -1
    for i, p in enumerate(prompts):
        g += i == 0 or p != prompts[i - 1]
        out.append(g)
    return out


def _logged_metrics(src: Path) -> dict[int, dict[str, float]] | None:
    """step -> steps columns from the newest checkpoint's trainer_state.json, None without one."""
    root = src.parent if src.is_file() or src.name == "completions" else src
    root = root.parent if root.name == "completions" else root
    found = sorted(
        (int(m.group(1)), p) for p in root.glob("checkpoint-*") if (m := _CHECKPOINT.match(p.name))
    )
    state = next(
        (p / "trainer_state.json" for _, p in reversed(found) if (p / "trainer_state.json").exists()), None
    )
    if state is None:
        return None
    out: dict[int, dict[str, float]] = {}
    for entry in json.loads(state.read_text()).get("log_history", []):
        if not isinstance(entry.get("step"), int) or any(k.startswith(("train_", "eval_")) for k in entry):
            continue
        out[entry["step"]] = {
            STEP_COLUMNS.get(k, f"trl_{_column(k)}"): float(v)
            for k, v in entry.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    return out


def _column(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(name)).strip("_")


def _provenance(src: Path, rewards: list[str], weights: list[float], logged: bool) -> Provenance:
    notes = [
        "TRL keeps the latest generation batch: with steps_per_generation > 1 consecutive files can hold "
        "the same completions",
        "group_id: runs of one prompt unless group_size (num_generations) is given",
    ]
    if not logged:
        notes.append("no checkpoint-*/trainer_state.json beside the completions: no loss, grad_norm or lr")
    return Provenance(
        format="trl_completions",
        source=str(src),
        source_layout="TRL GRPOTrainer completions_<step>.parquet (trl 1.16 layout)",
        derived={
            "samples.reward": f"sum of {rewards} weighted by {weights} (TRL's nansum)",
            "steps.reward_mean/reward_std": "mean and unbiased std of the step's rewards",
            "steps (others)": "trainer_state.json log_history of the newest checkpoint" if logged else "none",
        },
        notes=notes,
    )
