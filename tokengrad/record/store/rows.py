"""Turn what the recorder captured (numpy arrays) into Arrow tables of the run format.

Runs on the writer thread, so the training thread only pays for detaching and copying tensors.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokengrad import schema
from tokengrad.record.token_text import piece_text, safe_text

# Labels of tokens.selected_by, by the codes record.budget uses.
SELECTED_BY = ("all", "sequence", "top_update_share", "top_grad_norm", "top_abs_coef")

# Per-token float columns the recorder fills from tensors, in schema order.
TOKEN_VALUE_COLUMNS = (
    "logprob",
    "old_logprob",
    "ref_logprob",
    "rollout_logprob",
    "is_weight",
    "prob",
    "entropy",
    "sum_p2",
    "logit_grad_unit",
    "advantage",
    "weight",
    "coef",
    "ratio",
    "logit_grad_norm",
    "head_grad_norm",
    "update_share",
    "dlogprob_pred",
    "dlogprob",
    "entropy_share",
    "dentropy_pred",
    "dentropy",
)
# Columns where NaN means "no value", written as null and not counted in n_nonfinite: no sampler log-prob
# for a tool-output token; a share of an update with no gradient (|g|^2 = 0 or <grad H, g> = 0: the ratio
# is undefined, record/attribution/shares.py), as on a step whose every advantage is 0.
NAN_IS_NULL = frozenset({"rollout_logprob", "is_weight", "update_share", "entropy_share"})
# tokens.masked_by of a bit code (bit i: schema.MASK_REASONS[i]); code 0 (kept) is null
MASK_LABELS = [None] + [
    "+".join(r for i, r in enumerate(schema.MASK_REASONS) if code >> i & 1)
    for code in range(1, 2 ** len(schema.MASK_REASONS))
]


@dataclass(kw_only=True)
class CapturedBatch:
    """One tracked backward pass, on the CPU as numpy: [N, T] arrays unless noted."""

    pass_id: int
    update_id: int
    token_ids: np.ndarray
    mask: np.ndarray  # bool, recorded tokens
    in_loss: np.ndarray  # bool
    sample_ids: np.ndarray  # [N]
    group_ids: np.ndarray  # [N]
    values: dict[str, np.ndarray]  # TOKEN_VALUE_COLUMNS (missing -> null)
    clipped: np.ndarray | None = None  # bool
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # A budgeted step keeps some rows only: (rows [M], positions [M]) of the kept tokens, and then every
    # per-token array above is already [M] (gathered on the device); selected_by: [M] codes of
    # record.budget.SELECTED_BY.
    index: tuple[np.ndarray, np.ndarray] | None = None
    selected_by: np.ndarray | None = None
    policy_versions: np.ndarray | None = None  # [N] float64, NaN: unknown (tokens.policy_version)
    trainer_version: int | None = None  # tokens.trainer_version of every row


class TokenDecoder:
    """token id -> text piece, each id decoded once (cache shared across steps)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self.cache: dict[int, str | None] = {}

    def __call__(self, ids: np.ndarray) -> pa.Array:
        if self.tokenizer is None:
            return pa.nulls(len(ids), pa.string())
        uniq, inverse = np.unique(ids, return_inverse=True)
        for i in uniq.tolist():
            if i not in self.cache:
                self.cache[i] = self._decode(i)
        return pc.take(pa.array([self.cache[i] for i in uniq.tolist()], pa.string()), pa.array(inverse))

    def _decode(self, i: int) -> str | None:
        """One id's text; an id the tokenizer cannot decode keeps its row, with a null `token` (warned)."""
        try:
            # bytes that are no text alone read <0xNN>; a lone surrogate is stored escaped
            return safe_text(piece_text(self.tokenizer, i), f"the text of token id {i}")
        except Exception as err:  # noqa: BLE001 - tokenizers raise many types; the row matters more
            warnings.warn(
                f"tokengrad: the tokenizer cannot decode token id {i} ({type(err).__name__}: {err}); "
                "its rows get a null token text",
                RuntimeWarning,
                stacklevel=2,
            )
            return None


def tokens_table(step: int, rank: int, batches: list[CapturedBatch], decode: TokenDecoder) -> pa.Table | None:
    parts = [_batch_table(step, rank, b, decode) for b in batches]
    parts = [p for p in parts if p is not None and p.num_rows]
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive")


def _batch_table(step: int, rank: int, b: CapturedBatch, decode: TokenDecoder) -> pa.Table | None:
    if b.index is None:
        rows, pos = np.nonzero(b.mask)  # flat selection of recorded tokens

        def take(a):
            return a[rows, pos]
    else:
        rows, pos = b.index

        def take(a):
            return a

    n = len(rows)
    if n == 0:
        return None
    cols: dict[str, pa.Array] = {
        "step": pa.array(np.full(n, step, np.int32)),
        "rank": pa.array(np.full(n, rank, np.int16)),
        "update_id": pa.array(np.full(n, b.update_id, np.int16)),
        "pass_id": pa.array(np.full(n, b.pass_id, np.int16)),
        "sample_id": pa.array(b.sample_ids[rows].astype(np.int64)),
        "group_id": pa.array(b.group_ids[rows].astype(np.int64)),
        "position": pa.array(pos.astype(np.int32)),
        "token_id": pa.array(take(b.token_ids).astype(np.int32)),
    }
    cols["token"] = decode(take(b.token_ids))
    cols["in_loss"] = pa.array(take(b.in_loss))
    for name in TOKEN_VALUE_COLUMNS:
        v = b.values.get(name)
        cols[name] = (
            pa.nulls(n, pa.float32())
            if v is None
            else pa.array(take(v).astype(np.float32), from_pandas=name in NAN_IS_NULL)
        )
    cols["clipped"] = pa.nulls(n, pa.bool_()) if b.clipped is None else pa.array(take(b.clipped))
    cols["masked"], cols["masked_by"] = _masks(b.values.get("mask_code"), take, n)
    cols["policy_version"], cols["trainer_version"] = _versions(b, rows, n)
    cols["selected_by"] = (
        pa.nulls(n, pa.string())
        if b.selected_by is None
        else pa.DictionaryArray.from_arrays(
            pa.array(b.selected_by.astype(np.int32)), pa.array(SELECTED_BY)
        ).cast(pa.string())
    )
    fixed = pa.table(
        {c: cols[c] for c in schema.column_names("tokens")}, schema=schema.arrow_schema("tokens")
    )
    for name, v in b.extra.items():
        fixed = fixed.append_column(name, pa.array(take(v)))
    return fixed


def _versions(b: CapturedBatch, rows: np.ndarray, n: int) -> tuple[pa.Array, pa.Array]:
    """tokens.policy_version (per sequence: b.policy_versions[row], NaN written null) and trainer_version."""
    v = b.policy_versions
    policy = (
        pa.nulls(n, pa.int64())
        if v is None
        else pa.array(v[rows], pa.float64(), from_pandas=True).cast(pa.int64())
    )
    t = b.trainer_version
    trainer = pa.nulls(n, pa.int64()) if t is None else pa.array(np.full(n, t, np.int64))
    return policy, trainer


def _masks(code, take, n: int) -> tuple[pa.Array, pa.Array]:
    """tokens.masked and masked_by from the bit codes of the host's masks (None: no mask information)."""
    if code is None:
        return pa.nulls(n, pa.bool_()), pa.nulls(n, pa.string())
    c = take(code).astype(np.int32)
    labels = pa.DictionaryArray.from_arrays(pa.array(c), pa.array(MASK_LABELS, pa.string()))
    return pa.array(c != 0), labels.cast(pa.string())


def step_derived(batches: list[CapturedBatch]) -> dict[str, float]:
    """Step statistics that follow from the token rows (used when the caller did not log them)."""
    if not batches:
        return {"n_tokens": 0, "n_nonfinite": 0}
    if any(b.index is not None for b in batches):  # a budget's sample: record.budget computed them exactly
        return {}
    sel = [(b, b.in_loss & b.mask) for b in batches]

    def cat(name):
        arrs = [b.values[name][m] for b, m in sel if b.values.get(name) is not None]
        return np.concatenate(arrs) if arrs else np.empty(0)

    ent, w = cat("entropy"), cat("weight")
    clipped = [b.clipped[m] for b, m in sel if b.clipped is not None]
    # a token tracked in several passes (mu > 1, Lopti phases) counts once: distinct (sample_id, position)
    keys = [np.stack([b.sample_ids[r], p], 1) for b, m in sel for r, p in [np.nonzero(m)]]
    n_tokens = len(np.unique(np.concatenate(keys), axis=0)) if keys else 0
    out = {"n_tokens": n_tokens, "n_nonfinite": int(sum(_nonfinite(b) for b in batches))}
    out["entropy_mean"] = _nanmean(ent)
    if w.size:
        out.update(weight_mean=_nanmean(w), weight_min=float(np.nanmin(w)), weight_max=float(np.nanmax(w)))
    if clipped:
        out["clip_frac"] = float(np.concatenate(clipped).mean()) if sum(c.size for c in clipped) else math.nan
    return out


def _nonfinite(b: CapturedBatch) -> int:
    return sum(
        int((~np.isfinite(v[b.mask])).sum())
        for k, v in b.values.items()
        if v is not None and k not in NAN_IS_NULL and k != "mask_code"
    )


def _nanmean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def sample_rows(cols: dict, *, step: int, rank: int) -> list[dict]:
    """One samples-table row per completion from columns that are list-like of one length (sample_id's) or
    a single string (the same for every row) or None."""
    n = len(cols["sample_id"])
    for k, v in cols.items():
        if v is not None and not isinstance(v, str) and len(v) != n:
            raise ValueError(f"samples(): {k} has {len(v)} entries, sample_ids has {n}")
    one = lambda v, i: v if isinstance(v, str) or v is None else _item(v[i])  # noqa: E731
    return [dict({k: one(v, i) for k, v in cols.items()}, step=step, rank=rank) for i in range(n)]


def _item(v):
    return v.item() if hasattr(v, "item") else v


def scalar_table(table: str, rows: list[dict]) -> pa.Table | None:
    """Rows of a small table: fixed schema columns (missing -> null) plus any extra scalar columns."""
    if not rows:
        return None
    fixed = schema.arrow_schema(table)
    data = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in fixed}
    out = pa.table(data, schema=fixed)
    extras = sorted({k for r in rows for k in r} - set(fixed.names))
    if extras and table not in schema.EXTENSIBLE:
        raise ValueError(f"table {table!r} takes no extra columns, got {extras}")
    for k in extras:
        out = out.append_column(k, pa.array([_plain(r.get(k)) for r in rows]))
    return out


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def steps_row(step: int, rank: int, scalars: dict, captured: list[CapturedBatch]) -> dict:
    """The step's steps-table row: derived token aggregates, then the logged scalars; warns on NaN/inf."""
    derived = step_derived(captured)
    if derived.get("n_nonfinite"):
        warnings.warn(
            f"tokengrad: step {step}: {derived['n_nonfinite']} NaN/inf token values recorded as they are",
            RuntimeWarning,
            stacklevel=2,
        )
    return {**derived, **scalars, "step": step, "rank": rank}
