"""The exact aggregates of a budgeted step (budget/kept_rows.py), over every loss token before any row
is dropped: the steps table's token statistics, the per-step probability-bin histogram (`prob_bins`) and
the per-step vocabulary table (`vocab`), as tokengrad.read.queries computes them from full token tables.

    finite = finite_columns(values)                        # per pass: which columns hold no NaN/inf
    step_aggregates(passes, values, finite)                # {"n_tokens": ..., "entropy_mean": ...}
    prob_bin_rows(passes, values, 20, step, rank, finite, signs)
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import torch

from tokengrad import schema

PROB_BIN_SUMS = (
    "prob",
    "entropy",
    "logit_grad_unit",
    "abs_coef",
    "logit_grad_norm",
    "head_grad_norm",
    "update_share",
    "entropy_share",
)


# ---- exact aggregates --------------------------------------------------------------------------------
# Grouped sums use one bincount over every [N, T] position, masked-out positions sent to a spare last bin:
# no boolean gathers of the large tensors, and no sort (torch.unique) over millions of tokens.
# `finite` (finite_columns) says per pass which value columns hold no NaN/inf at all: those skip the
# isfinite masks and nan_to_num copies, which are then the identity, so every figure is the same.
def finite_columns(values: list[dict]) -> list[dict[str, bool]]:
    """Per pass: float column -> every entry of the [N, T] tensor is finite. A float32 sum is finite only
    then (an overflowing sum of finite values reads False: the column then takes the exact, slower path);
    one stacked reduction and one host transfer per pass."""
    out = []
    for v in values:
        names = [k for k, t in v.items() if t.is_floating_point()]
        sums = torch.stack([v[k].sum() for k in names]) if names else torch.zeros(0)  # [C]
        out.append(dict(zip(names, torch.isfinite(sums).tolist())))
    return out


def _masked_sum(t: torch.Tensor, m: torch.Tensor, finite: bool = False) -> tuple[float, int]:
    """(sum, count) of the finite entries of t where m ([N, T] each); `finite`: t holds no NaN/inf."""
    ok = m if finite else m & torch.isfinite(t)
    return float(torch.where(ok, t.double(), 0.0).sum()), int(ok.sum())


def _distinct_tokens(passes: list, sel: list[torch.Tensor]) -> int:
    """Loss tokens counted once over passes (a token tracked in several passes, mu > 1 or Lopti phases)."""
    ids = torch.cat([p.sample_ids for p in passes])  # [sum N] small
    if torch.unique(ids).numel() == ids.numel():  # no sequence in two passes: a plain count
        return int(sum(int(m.sum()) for m in sel))
    keys = [
        p.sample_ids.unsqueeze(1).expand_as(m)[m] * (1 << 32) + m.nonzero()[:, 1]  # (sample, position)
        for p, m in zip(passes, sel)
    ]
    return int(torch.unique(torch.cat(keys)).numel())


def step_aggregates(passes: list, values: list[dict], finite: list[dict] | None = None) -> dict[str, float]:
    """The steps table's token statistics over all loss tokens (as rows.step_derived on all rows)."""
    finite = finite_columns(values) if finite is None else finite
    sel = [p.in_loss & p.mask for p in passes]
    out: dict[str, float] = {"n_tokens": _distinct_tokens(passes, sel)}
    out["n_nonfinite"] = int(
        sum(
            int((~torch.isfinite(t) & p.mask).sum())
            for p, v, f in zip(passes, values, finite)
            for k, t in v.items()
            if not k.startswith("_") and k != "abs_coef" and t.is_floating_point() and not f[k]
        )
    )

    def mean(name):
        parts = [_masked_sum(v[name], m, f[name]) for v, m, f in zip(values, sel, finite) if name in v]
        n = sum(c for _, c in parts)
        return (sum(s for s, _ in parts) / n if n else math.nan), bool(parts)

    out["entropy_mean"] = mean("entropy")[0]
    w_mean, has_w = mean("weight")
    if has_w:
        inf = torch.tensor(math.inf)

        def ok(v, m, f):  # [N, T] loss tokens with a finite weight
            return m if f["weight"] else m & torch.isfinite(v["weight"])

        lo = min(
            float(torch.where(ok(v, m, f), v["weight"], inf).min()) for v, m, f in zip(values, sel, finite)
        )
        hi = max(
            float(torch.where(ok(v, m, f), v["weight"], -inf).max()) for v, m, f in zip(values, sel, finite)
        )
        out.update(
            weight_mean=w_mean,
            weight_min=lo if math.isfinite(lo) else math.nan,
            weight_max=hi if math.isfinite(hi) else math.nan,
        )
    clipped = [
        (int((p.clipped & m).sum()), int(m.sum())) for p, m in zip(passes, sel) if p.clipped is not None
    ]
    if clipped:
        n = sum(c for _, c in clipped)
        out["clip_frac"] = sum(k for k, _ in clipped) / n if n else math.nan
    return out


def sign_index(v: dict, like: torch.Tensor) -> torch.Tensor:
    """[N, T] 0, 1, 2 for negative, zero, positive advantage (1 without advantages)."""
    adv = v.get("advantage")
    return torch.ones_like(like, dtype=torch.long) if adv is None else torch.sign(adv).long() + 1


def _grouped(
    key: torch.Tensor,
    m: torch.Tensor,
    n_keys: int,
    weights: torch.Tensor | None = None,
    finite: bool = False,
) -> torch.Tensor:
    """Per-key sums (or counts) over the positions in m; [N, T] inputs -> [n_keys] float64 on the CPU.
    NaN weights count as 0; `finite`: the weights hold no NaN/inf (nan_to_num would change nothing)."""
    k = torch.where(m, key, n_keys).flatten()
    w = None if weights is None else weights.double().flatten()
    if w is not None and not finite:
        w = torch.nan_to_num(w, nan=0.0)
    return torch.bincount(k, weights=w, minlength=n_keys + 1)[:n_keys].double().cpu()


def prob_bin_rows(
    passes: list,
    values: list[dict],
    *,
    n_bins: int,
    step: int,
    rank: int,
    finite: list[dict] | None = None,
    signs: list[torch.Tensor] | None = None,
) -> list[dict]:
    """One row per (update_id, probability bin, advantage sign) with loss tokens: count and the sums of
    PROB_BIN_SUMS (None where the value was not recorded; NaN values count as 0). `finite`: of
    finite_columns; `signs`: [N, T] of sign_index per pass (both computed here when not given)."""
    finite = finite_columns(values) if finite is None else finite
    signs = [sign_index(v, p.mask) for p, v in zip(passes, values)] if signs is None else signs
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64)
    rows, n_keys = [], n_bins * 3
    for u in sorted({p.update_id for p in passes}):
        acc = torch.zeros(1 + len(PROB_BIN_SUMS), n_keys, dtype=torch.float64)
        have = set()
        for p, v, f, sign in zip(passes, values, finite, signs):
            if p.update_id != u:
                continue
            m = p.in_loss & p.mask  # [N, T]
            prob = v["prob"].double()
            b = torch.bucketize(prob, edges[1:-1].to(prob.device), right=True).clamp(0, n_bins - 1)
            key = b * 3 + sign  # [N, T]
            acc[0] += _grouped(key, m, n_keys)
            for j, name in enumerate(PROB_BIN_SUMS):
                if name in v:
                    have.add(name)
                    acc[1 + j] += _grouped(key, m, n_keys, v[name], f[name])
        for key in acc[0].nonzero().squeeze(1).tolist():
            b, s = divmod(key, 3)
            row = dict(
                step=step,
                rank=rank,
                update_id=u,
                lo=float(edges[b]),
                hi=float(edges[b + 1]),
                adv_sign=s - 1,
                n_tokens=int(acc[0, key]),
            )
            row.update(
                {
                    f"sum_{n}": float(acc[1 + j, key]) if n in have else None
                    for j, n in enumerate(PROB_BIN_SUMS)
                }
            )
            rows.append(row)
    return rows


def vocab_arrays(
    passes: list,
    values: list[dict],
    *,
    edges: tuple[float, ...],
    top: int,
    finite: list[dict] | None = None,
    signs: list[torch.Tensor] | None = None,
) -> dict[str, np.ndarray]:
    """The step's top tokens by count and by summed |update_share| (else logit_grad_norm), split by
    advantage sign and probability bucket: token_id, adv_sign, lo, hi, n_tokens, sum_prob,
    sum_update_share, sum_logit_grad_norm as numpy arrays (the writer thread decodes the tokens).
    `finite`, `signs` as for prob_bin_rows."""
    sel = [p.in_loss & p.mask for p in passes]
    if not any(bool(m.any()) for m in sel):
        return {}
    finite = finite_columns(values) if finite is None else finite
    signs = [sign_index(v, p.mask) for p, v in zip(passes, values)] if signs is None else signs
    # ids outside the loss (padding, tool output) may exceed the largest loss token: read as 0 there
    ids = [torch.where(m, p.token_ids.long(), 0) for p, m in zip(passes, sel)]  # [N, T] each
    n_vocab = 1 + max(int(i.max()) for i in ids)
    has = {n: all(n in v for v in values) for n in ("update_share", "logit_grad_norm")}
    rank_by = "update_share" if has["update_share"] else "logit_grad_norm" if has["logit_grad_norm"] else None
    kept = _top_tokens(ids, values, sel, finite=finite, n_vocab=n_vocab, top=top, rank_by=rank_by)
    slot = torch.full((n_vocab,), -1, dtype=torch.long)
    slot[kept] = torch.arange(len(kept))  # token -> kept index
    nb, inner = len(edges) - 1, torch.tensor(edges[1:-1], dtype=torch.float64)
    n_keys = len(kept) * 3 * nb
    cols = {
        c: torch.zeros(n_keys, dtype=torch.float64)
        for c in ("n", "sum_prob", "update_share", "logit_grad_norm")
    }
    for i, v, m, f, sign in zip(ids, values, sel, finite, signs):
        s = slot.to(i.device)[i]  # [N, T]
        bucket = torch.bucketize(v["prob"].double(), inner.to(s.device), right=True)
        key = (s * 3 + sign) * nb + bucket
        mk = m & (s >= 0)
        cols["n"] += _grouped(key, mk, n_keys)
        cols["sum_prob"] += _grouped(key, mk, n_keys, v["prob"], f["prob"])
        for c in ("update_share", "logit_grad_norm"):
            if has[c]:
                cols[c] += _grouped(key, mk, n_keys, v[c], f[c])
    nz = cols["n"].nonzero().squeeze(1)
    tok, rest = kept[nz // (3 * nb)], nz % (3 * nb)
    b, e = (rest % nb).numpy(), np.asarray(edges)
    return {
        "token_id": tok.numpy().astype(np.int32),
        "adv_sign": (rest // nb - 1).numpy().astype(np.int8),
        "lo": e[b].astype(np.float32),
        "hi": e[b + 1].astype(np.float32),
        "n_tokens": cols["n"][nz].numpy().astype(np.int64),
        "sum_prob": cols["sum_prob"][nz].numpy(),
        "sum_update_share": cols["update_share"][nz].numpy() if has["update_share"] else None,
        "sum_logit_grad_norm": cols["logit_grad_norm"][nz].numpy() if has["logit_grad_norm"] else None,
    }


def _top_tokens(ids, values, sel, *, finite, n_vocab: int, top: int, rank_by: str | None) -> torch.Tensor:
    """The token ids the vocab table keeps (sorted): the `top` most frequent loss tokens, and the `top`
    with the largest summed |rank_by| (the update they made) where that value was recorded."""
    count = sum(_grouped(i, m, n_vocab) for i, m in zip(ids, sel))  # [V]
    k = min(top, int((count > 0).sum()))
    keep = set(torch.topk(count, k).indices.tolist())
    if rank_by is not None:
        mass = sum(
            _grouped(i, m, n_vocab, v[rank_by].abs(), f[rank_by])
            for i, v, m, f in zip(ids, values, sel, finite)
        )  # [V]
        keep |= set(torch.topk(mass, k).indices.tolist())
    return torch.tensor(sorted(keep), dtype=torch.long)


def vocab_table(step: int, rank: int, arrays: dict[str, np.ndarray], decode) -> pa.Table | None:
    """The vocab table of a step from `vocab_arrays` (runs on the writer thread: decoding is there)."""
    if not arrays:
        return None
    n = len(arrays["token_id"])
    cols = {"step": np.full(n, step, np.int32), "rank": np.full(n, rank, np.int16), **arrays}
    fixed = schema.arrow_schema("vocab")
    data = {
        f.name: (
            decode(arrays["token_id"])
            if f.name == "token"
            else pa.nulls(n, f.type)
            if cols.get(f.name) is None
            else pa.array(cols[f.name], f.type)
        )
        for f in fixed
    }
    return pa.table(data, schema=fixed)
