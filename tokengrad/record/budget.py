"""Budgeted recording: at most K token rows per step and rank, with every aggregate still exact.

At cluster scale a step holds tens of millions of tokens (512 prompts x 16 samples x 4k tokens = 33 M), so
`Recorder(token_budget=K)` keeps K rows, chosen as

- whole sampled sequences (uniformly, seeded by step and rank) filling `sequence_fraction` of K, so the
  inspector shows complete completions (`selected_by` = "sequence"), then
- the tokens with the largest |update_share| ("top_update_share"), or, on steps without attribution, the
  largest logit_grad_norm ("top_grad_norm") or |coef| ("top_abs_coef"), filling the rest.

A step that fits the budget keeps every row ("all"). Before sampling, on the device where the tensors are,
everything the dashboard aggregates is computed over all tokens: the steps table's token statistics,
a per-step probability-bin histogram (`prob_bins`) and a per-step vocabulary table of the top tokens by
count and by summed |update_share| (`vocab`). Loss tokens of every pass count, as in tokengrad.queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from tokengrad import schema
from tokengrad.record.rows import CapturedBatch, scalar_table

ALL, SEQUENCE = 0, 1  # codes of rows.SELECTED_BY; 2.. are the ranking's
PROB_BIN_SUMS = ("prob", "entropy", "logit_grad_unit", "abs_coef", "logit_grad_norm", "head_grad_norm",
                 "update_share")


@dataclass(frozen=True)
class Budget:
    """k: token rows per step and rank; sequence_fraction: the part of k given to whole sequences;
    prob_bins: equal-width probability bins of the prob_bins table; vocab_top: tokens kept per step by
    count and, separately, by summed |update_share|; seed: of the sequence sample."""

    k: int
    sequence_fraction: float = 0.5
    prob_bins: int = 20
    vocab_top: int = 200
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.k, (int, np.integer)) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"token_budget must be an integer >= 1 (or None for no budget), got {self.k!r}")
        if not 0.0 <= self.sequence_fraction <= 1.0:
            raise ValueError(f"sequence_fraction must be in [0, 1], got {self.sequence_fraction}")
        if self.prob_bins < 1 or self.vocab_top < 1:
            raise ValueError(f"prob_bins and vocab_top must be >= 1, got {self.prob_bins}, {self.vocab_top}")


# ---- per-token values on the device ------------------------------------------------------------------
def token_values(p) -> dict[str, torch.Tensor]:
    """The per-token values the aggregates and the ranking read, [N, T] each, from a tracked pass."""
    v = dict(p.tensors)
    if p.coef is not None:
        v["coef"] = p.coef.float()
        v["abs_coef"] = v["coef"].abs()
        if "logit_grad_unit" in v:
            v["logit_grad_norm"] = v["abs_coef"] * v["logit_grad_unit"]
            if "_hidden_norm" in v:
                v["head_grad_norm"] = v["logit_grad_norm"] * v["_hidden_norm"]
    return v


def ranking(v: dict[str, torch.Tensor]) -> tuple[int, torch.Tensor]:
    """(selected_by code, score [N, T]) of the top-token part: |update_share|, else logit_grad_norm, else
    |coef|, else nothing (zeros)."""
    for code, name in ((2, "update_share"), (3, "logit_grad_norm"), (4, "abs_coef")):
        if name in v:
            return code, v[name].abs()
    return 4, torch.zeros_like(v["logprob"])


# ---- sampling ----------------------------------------------------------------------------------------
def select_rows(passes: list, values: list[dict], budget: Budget, step: int, rank: int
                ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per pass (rows [M], positions [M], selected_by codes [M]) of the kept token rows, at most k in all."""
    n_rows = sum(int(p.mask.sum()) for p in passes)
    if n_rows <= budget.k:
        out = []
        for p in passes:
            r, c = p.mask.nonzero(as_tuple=True)
            out.append((r, c, torch.full_like(r, ALL)))
        return out
    seq_sel = _sample_sequences(passes, int(budget.k * budget.sequence_fraction), step, rank, budget.seed)
    n_seq = sum(int(s.sum()) for s in seq_sel)
    flat, where = [], []
    for i, (p, v, s) in enumerate(zip(passes, values, seq_sel)):
        r, c = (p.mask & ~s).nonzero(as_tuple=True)                               # [M_i] candidates
        score = torch.nan_to_num(ranking(v)[1][r, c].float(), nan=-math.inf)
        flat.append(score)
        where.append(torch.stack([torch.full_like(r, i), r, c], 1))             # [M_i, 3]
    flat_t, where_t = torch.cat(flat), torch.cat(where)
    top = torch.topk(flat_t, min(budget.k - n_seq, flat_t.numel())).indices
    chosen = where_t[top]                                                           # [K_top, 3]
    out = []
    for i, (p, v, s) in enumerate(zip(passes, values, seq_sel)):
        code = ranking(v)[0]
        sel = s.clone()
        mine = chosen[chosen[:, 0] == i]
        codes = torch.zeros_like(p.mask, dtype=torch.long)
        codes[s] = SEQUENCE
        sel[mine[:, 1], mine[:, 2]] = True
        codes[mine[:, 1], mine[:, 2]] = code
        r, c = sel.nonzero(as_tuple=True)
        out.append((r, c, codes[r, c]))
    return out


def _sample_sequences(passes: list, quota: int, step: int, rank: int, seed: int) -> list[torch.Tensor]:
    """[N, T] bool per pass: every recorded row of a uniform sample of sequences, at most `quota` rows."""
    dev = passes[0].mask.device
    ids = torch.cat([p.sample_ids for p in passes])                                 # [sum N]
    uniq, inv = torch.unique(ids, return_inverse=True)
    lengths = torch.cat([p.mask.sum(1) for p in passes]).long()                     # [sum N]
    per_seq = torch.zeros(len(uniq), dtype=torch.long, device=dev).index_add_(0, inv, lengths)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 65_537 + rank)
    order = torch.randperm(len(uniq), generator=gen).to(dev)
    keep_sorted = per_seq[order].cumsum(0) <= quota                                 # a prefix of the order
    chosen = uniq[order[keep_sorted]]
    return [torch.isin(p.sample_ids, chosen).unsqueeze(1) & p.mask for p in passes]


# ---- exact aggregates --------------------------------------------------------------------------------
def step_aggregates(passes: list, values: list[dict]) -> dict[str, float]:
    """The steps table's token statistics over all loss tokens (as rows.step_derived on all rows)."""
    sel = [p.in_loss & p.mask for p in passes]
    out: dict[str, float] = {}
    keys = [p.sample_ids.unsqueeze(1).expand_as(m)[m] * (1 << 32) + m.nonzero()[:, 1]   # (sample, position)
            for p, m in zip(passes, sel)]
    out["n_tokens"] = int(torch.unique(torch.cat(keys)).numel()) if keys else 0
    out["n_nonfinite"] = int(sum(int((~torch.isfinite(t[p.mask])).sum()) for p, v in zip(passes, values)
                                 for k, t in v.items() if not k.startswith("_") and k != "abs_coef"
                                 and t.is_floating_point()))

    def cat(name):
        parts = [v[name][m] for v, m in zip(values, sel) if name in v]
        return torch.cat(parts).double() if parts else torch.empty(0, dtype=torch.float64)

    ent, w = cat("entropy"), cat("weight")
    out["entropy_mean"] = _nanmean(ent)
    if w.numel():
        fin = w[torch.isfinite(w)]
        out.update(weight_mean=_nanmean(w), weight_min=float(fin.min()) if fin.numel() else math.nan,
                   weight_max=float(fin.max()) if fin.numel() else math.nan)
    clipped = [p.clipped[m] for p, m in zip(passes, sel) if p.clipped is not None]
    if clipped:
        c = torch.cat(clipped)
        out["clip_frac"] = float(c.float().mean()) if c.numel() else math.nan
    return out


def _nanmean(x: torch.Tensor) -> float:
    x = x[torch.isfinite(x)]
    return float(x.mean()) if x.numel() else math.nan


def _sign(v: dict, m: torch.Tensor) -> torch.Tensor:
    adv = v.get("advantage")
    return torch.zeros(int(m.sum()), dtype=torch.long, device=m.device) if adv is None else \
        torch.sign(adv[m]).long()


def prob_bin_rows(passes: list, values: list[dict], n_bins: int, step: int, rank: int) -> list[dict]:
    """One row per (update_id, probability bin, advantage sign) with loss tokens: count and the sums of
    PROB_BIN_SUMS (None where the value was not recorded)."""
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64)
    rows = []
    for u in sorted({p.update_id for p in passes}):
        n_keys = n_bins * 3
        acc = torch.zeros(1 + len(PROB_BIN_SUMS), n_keys, dtype=torch.float64)
        have = set()
        for p, v in zip(passes, values):
            if p.update_id != u:
                continue
            m = p.in_loss & p.mask                                                  # [N, T]
            prob = v["prob"][m].double()                                            # [M]
            b = torch.bucketize(prob, edges[1:-1].to(prob.device), right=True).clamp(0, n_bins - 1)
            key = (b * 3 + _sign(v, m) + 1).cpu()                                   # [M]
            acc[0] += torch.bincount(key, minlength=n_keys).double()
            for j, name in enumerate(PROB_BIN_SUMS):
                if name in v:
                    have.add(name)
                    acc[1 + j] += torch.bincount(key, weights=v[name][m].double().cpu(), minlength=n_keys)
        for key in acc[0].nonzero().squeeze(1).tolist():
            b, s = divmod(key, 3)
            row = dict(step=step, rank=rank, update_id=u, lo=float(edges[b]), hi=float(edges[b + 1]),
                       adv_sign=s - 1, n_tokens=int(acc[0, key]))
            row.update({f"sum_{n}": float(acc[1 + j, key]) if n in have else None
                        for j, n in enumerate(PROB_BIN_SUMS)})
            rows.append(row)
    return rows


def vocab_arrays(passes: list, values: list[dict], edges: tuple[float, ...], top: int
                 ) -> dict[str, np.ndarray]:
    """The step's top tokens by count and by summed |update_share| (else logit_grad_norm), split by
    advantage sign and probability bucket: token_id, adv_sign, lo, hi, n_tokens, sum_prob,
    sum_update_share, sum_logit_grad_norm as numpy arrays (the writer thread decodes the tokens)."""
    sel = [p.in_loss & p.mask for p in passes]
    if not any(bool(m.any()) for m in sel):
        return {}
    tok = torch.cat([p.token_ids[m].long() for p, m in zip(passes, sel)])           # [M]
    sign = torch.cat([_sign(v, m) for v, m in zip(values, sel)])
    inner = torch.tensor(edges[1:-1], dtype=torch.float64)
    prob = torch.cat([v["prob"][m].double() for v, m in zip(values, sel)])
    bucket = torch.bucketize(prob, inner.to(prob.device), right=True)

    def col(name):
        if not all(name in v for v in values):
            return None
        return torch.cat([v[name][m].double() for v, m in zip(values, sel)])

    share, lgn = col("update_share"), col("logit_grad_norm")
    uniq, inv = torch.unique(tok, return_inverse=True)
    count = torch.bincount(inv, minlength=len(uniq))
    mass_src = share.abs() if share is not None else lgn
    keep = set(torch.topk(count.double(), min(top, len(uniq))).indices.tolist())
    if mass_src is not None:
        mass = torch.bincount(inv, weights=torch.nan_to_num(mass_src), minlength=len(uniq))
        keep |= set(torch.topk(mass, min(top, len(uniq))).indices.tolist())
    kept = torch.zeros(len(uniq), dtype=torch.bool, device=tok.device)
    kept[torch.tensor(sorted(keep), dtype=torch.long, device=tok.device)] = True
    m = kept[inv]
    nb = len(edges) - 1
    key = (inv[m] * 3 + sign[m] + 1) * nb + bucket[m]                                 # [M_kept]
    ukey, kinv = torch.unique(key, return_inverse=True)

    def sums(x):
        return None if x is None else torch.bincount(kinv, weights=x[m], minlength=len(ukey)).cpu().numpy()

    tid = uniq[ukey // (3 * nb)].cpu().numpy()
    rest = (ukey % (3 * nb)).cpu().numpy()
    b = rest % nb
    e = np.asarray(edges)
    return {"token_id": tid.astype(np.int32), "adv_sign": (rest // nb - 1).astype(np.int8),
            "lo": e[b].astype(np.float32), "hi": e[b + 1].astype(np.float32),
            "n_tokens": torch.bincount(kinv, minlength=len(ukey)).cpu().numpy().astype(np.int64),
            "sum_prob": sums(prob), "sum_update_share": sums(share), "sum_logit_grad_norm": sums(lgn)}


# ---- moving the kept rows to the host ----------------------------------------------------------------
def capture_pass(p, sel: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> CapturedBatch:
    """A tracked pass as numpy for the writer thread: [N, T] arrays, or with `sel` = (rows, positions,
    codes) only the kept rows, gathered on the device first so only they cross to the host."""
    v = token_values(p)
    if sel is None:
        def take(t):
            return t.cpu().numpy()
    else:
        rows, pos, _ = sel

        def take(t):
            return t[rows, pos].cpu().numpy()
    names = [k for k in v if not k.startswith("_") and k != "abs_coef"]
    return CapturedBatch(
        p.pass_id,
        p.update_id,
        take(p.token_ids),
        p.mask.cpu().numpy() if sel is None else p.mask[rows, pos].cpu().numpy(),
        take(p.in_loss),
        p.sample_ids.cpu().numpy(),
        p.group_ids.cpu().numpy(),
        {k: take(v[k].float()) for k in names},
        None if p.clipped is None else take(p.clipped),
        {k: take(t) for k, t in p.extra.items()},
        index=None if sel is None else (sel[0].cpu().numpy(), sel[1].cpu().numpy()),
        selected_by=None if sel is None else sel[2].cpu().numpy(),
    )


def budgeted(passes: list, budget: Budget, step: int, rank: int, edges: tuple[float, ...], scalars: dict,
             tables: dict, decode) -> list[CapturedBatch]:
    """The kept rows of a budgeted step; fills `scalars` with the exact token statistics (values the
    caller logged win) and `tables` with the prob_bins and vocab payloads."""
    values = [token_values(p) for p in passes]
    for k, v in step_aggregates(passes, values).items():
        scalars.setdefault(k, v)
    bins = prob_bin_rows(passes, values, budget.prob_bins, step, rank)
    vocab = vocab_arrays(passes, values, edges, budget.vocab_top)
    tables["prob_bins"] = lambda: scalar_table("prob_bins", bins)
    tables["vocab"] = lambda: vocab_table(step, rank, vocab, decode)
    sel = select_rows(passes, values, budget, step, rank)
    return [capture_pass(p, s) for p, s in zip(passes, sel)]


def vocab_table(step: int, rank: int, arrays: dict[str, np.ndarray], decode) -> pa.Table | None:
    """The vocab table of a step from `vocab_arrays` (runs on the writer thread: decoding is there)."""
    if not arrays:
        return None
    n = len(arrays["token_id"])
    cols = {"step": np.full(n, step, np.int32), "rank": np.full(n, rank, np.int16), **arrays}
    fixed = schema.arrow_schema("vocab")
    data = {f.name: (decode(arrays["token_id"]) if f.name == "token" else
                     pa.nulls(n, f.type) if cols.get(f.name) is None else pa.array(cols[f.name], f.type))
            for f in fixed}
    return pa.table(data, schema=fixed)
