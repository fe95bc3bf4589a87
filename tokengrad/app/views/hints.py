"""Empty-state hints that match how the run was made: a TRL run is told about `attach(...)`, a plain
PyTorch loop about `Recorder(...)`, the built-in trainer about its config keys, a verl run about its
Recorder options.

    hint(meta, "buckets")   # -> "Record it with `attach(trainer, dir, buckets=N)` ..."

tokengrad.read.meta_file.origin says how the run was recorded (from meta.json's config); HINTS holds one
sentence per (origin, what is missing). A new integration is one meta_file.INTEGRATIONS entry and its row
of HINTS.
"""

from __future__ import annotations

from tokengrad.read.meta_file import origin

_LOOP = {
    "buckets": "Record it with `Recorder(..., buckets=N)` (one extra backward per bucket on every N-th "
    "step).",
    "attribution": "Record it with `Recorder(..., attribution=N)` and track each pass with `recompute=`: "
    "every token of those steps gets update_share, its exact share of the update.",
    "tokens": "Record per-token rows with `st.track(logprobs, token_ids=..., mask=..., logits=...)` in each "
    "`rec.step()`.",
    "steps": "Log step scalars with `st.log(loss=..., reward_mean=..., kl=...)` in each `rec.step()`.",
    "layers": "Record gradient norms with `st.record_grad_norms()` after the last backward of each update.",
    "evals": "Log evaluations with `rec.log_eval(step, task=..., difficulty=..., accuracy=..., n=...)`.",
    "whatif": 'Record them with `Recorder(..., whatif=WhatIf(rules=["tr_grpo", "lopti"], every=N, '
    "loss={...}))`: each rule's gradient from the same parameters on the same passes.",
}
HINTS = {
    "loop": _LOOP,
    "verl": {
        **_LOOP,
        "buckets": "The verl integration records no bucket analysis; a plain loop or TRL run records it "
        "with `Recorder(..., buckets=N)` or `attach(trainer, dir, buckets=N)`.",
        "attribution": "The verl integration records no per-token attribution; a plain loop records it "
        "with `Recorder(..., attribution=N)`.",
        "layers": "The verl integration records no gradient norms.",
        "evals": "The verl integration records no evaluations.",
        "whatif": "The verl integration records no what-if updates; a plain loop, TRL or the built-in "
        "trainer records them (`WhatIf`, `attach(..., whatif=...)`, the config key `whatif`).",
    },
    "trl": {
        "buckets": "Record it with `attach(trainer, dir, buckets=N)` (one extra backward per bucket on every "
        "N-th step).",
        "attribution": "Record it with `attach(trainer, dir, attribution=N)`: every token of those steps "
        "gets update_share, its exact share of the update.",
        "tokens": "`attach(trainer, dir)` records every completion token; this run has none yet.",
        "steps": "`attach(trainer, dir)` records a step per generation batch, whatever `logging_steps` says.",
        "layers": "`attach(trainer, dir)` records gradient norms before clipping at every optimizer step.",
        "evals": "TRL evaluations are not recorded; log them with `rec.log_eval(...)` on the recorder "
        "`attach` returns.",
        "whatif": 'Record them with `attach(trainer, dir, whatif=WhatIf(rules=["tr_grpo", "lopti"], '
        "every=N))`: each rule's gradient from the same parameters on the same batch, with TRL's loss "
        "settings.",
    },
    "trainer": {
        "buckets": "Train with the config key `bucket_every = N` (one extra backward per bucket on every "
        "N-th step).",
        "attribution": "Train with the config key `attribute_every = N`: every token of those steps gets "
        "update_share, its exact share of the update.",
        "tokens": "The built-in trainer records every token; this run has none yet.",
        "steps": "The built-in trainer records every step; this run has none yet.",
        "layers": "The built-in trainer records gradient norms at every update; this run has none yet.",
        "evals": "Train with the config key `eval_every = K` (and `eval_at_start = true` for step −1).",
        "whatif": 'Train with the config keys `whatif = ["tr_grpo", "lopti"]` and `whatif_every = N`: each '
        "rule's gradient from the same parameters on the same batch, beside the real update.",
    },
}


def hint(meta: dict | None, missing: str) -> str:
    """How to record `missing` (a HINTS key) the way this run was made."""
    table = HINTS[origin(meta)]
    if missing not in table:
        raise ValueError(f"no hint for {missing!r}; known: {sorted(table)}")
    return table[missing]
