"""Budgeted recording: at most K token rows per step and rank, with every aggregate still exact.

At cluster scale a step holds tens of millions of tokens (512 prompts x 16 samples x 4k tokens = 33 M), so
`Recorder(budget=K)` (or `budget=Budget(k, ...)`) keeps K rows, chosen as

- whole sampled sequences (uniformly, seeded by step and rank) filling `sequence_fraction` of K, so the
  inspector shows complete completions (`selected_by` = "sequence"), then
- the tokens with the largest |update_share| ("top_update_share"), or, on steps without attribution, the
  largest logit_grad_norm ("top_grad_norm") or |coef| ("top_abs_coef"), filling the rest.

A step that fits the budget keeps every row ("all"). Before sampling, on the device where the tensors are,
everything the dashboard aggregates is computed over all tokens: the steps table's token statistics,
a per-step probability-bin histogram (`prob_bins`) and a per-step vocabulary table of the top tokens by
count and by summed |update_share| (`vocab`). Loss tokens of every pass count, as in tokengrad.read.queries.

Where the work runs (`BudgetedStep`): for tensors on an accelerator, on the training thread at the end of the
step (the kernels are queued on the device, and only the kept rows and the small aggregates cross to the
host); for tensors on the CPU, on the writer thread, like the rows of a step recorded in full: the tensors
are host memory already, so the training thread hands them over and pays no more than for recording every
row.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from tokengrad import schema
from tokengrad.record.rows import CapturedBatch

ALL, SEQUENCE = 0, 1  # codes of rows.SELECTED_BY; 2.. are the ranking's
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
            raise ValueError(
                f"the token budget (budget=K) must be an integer >= 1 (or None for no budget), got {self.k!r}"
            )
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
def select_rows(
    passes: list, values: list[dict], budget: Budget, step: int, rank: int
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
    ranked = [ranking(v) for v in values]  # (code, score [N, T]) per pass
    flat, where = [], []
    for i, (p, (_, rank_score), s) in enumerate(zip(passes, ranked, seq_sel)):
        r, c = (p.mask & ~s).nonzero(as_tuple=True)  # [M_i] candidates
        score = torch.nan_to_num(rank_score[r, c].float(), nan=-math.inf)
        flat.append(score)
        where.append(torch.stack([torch.full_like(r, i), r, c], 1))  # [M_i, 3]
    flat_t, where_t = torch.cat(flat), torch.cat(where)
    top = torch.topk(flat_t, min(budget.k - n_seq, flat_t.numel())).indices
    chosen = where_t[top]  # [K_top, 3]
    out = []
    for i, (p, (code, _), s) in enumerate(zip(passes, ranked, seq_sel)):
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
    ids = torch.cat([p.sample_ids for p in passes])  # [sum N]
    uniq, inv = torch.unique(ids, return_inverse=True)
    lengths = torch.cat([p.mask.sum(1) for p in passes]).long()  # [sum N]
    per_seq = torch.zeros(len(uniq), dtype=torch.long, device=dev).index_add_(0, inv, lengths)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 65_537 + rank)
    order = torch.randperm(len(uniq), generator=gen).to(dev)
    keep_sorted = per_seq[order].cumsum(0) <= quota  # a prefix of the order
    chosen = uniq[order[keep_sorted]]
    return [torch.isin(p.sample_ids, chosen).unsqueeze(1) & p.mask for p in passes]


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


def _sign_index(v: dict, like: torch.Tensor) -> torch.Tensor:
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
    n_bins: int,
    step: int,
    rank: int,
    finite: list[dict] | None = None,
    signs: list[torch.Tensor] | None = None,
) -> list[dict]:
    """One row per (update_id, probability bin, advantage sign) with loss tokens: count and the sums of
    PROB_BIN_SUMS (None where the value was not recorded; NaN values count as 0). `finite`: of
    finite_columns; `signs`: [N, T] of _sign_index per pass (both computed here when not given)."""
    finite = finite_columns(values) if finite is None else finite
    signs = [_sign_index(v, p.mask) for p, v in zip(passes, values)] if signs is None else signs
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
    signs = [_sign_index(v, p.mask) for p, v in zip(passes, values)] if signs is None else signs
    # ids outside the loss (padding, tool output) may exceed the largest loss token: read as 0 there
    ids = [torch.where(m, p.token_ids.long(), 0) for p, m in zip(passes, sel)]  # [N, T] each
    n_vocab = 1 + max(int(i.max()) for i in ids)
    has = {n: all(n in v for v in values) for n in ("update_share", "logit_grad_norm")}
    rank_by = "update_share" if has["update_share"] else "logit_grad_norm" if has["logit_grad_norm"] else None
    count = sum(_grouped(i, m, n_vocab) for i, m in zip(ids, sel))  # [V]
    keep = set(torch.topk(count, min(top, int((count > 0).sum()))).indices.tolist())
    if rank_by is not None:
        mass = sum(
            _grouped(i, m, n_vocab, v[rank_by].abs(), f[rank_by])
            for i, v, m, f in zip(ids, values, sel, finite)
        )
        keep |= set(torch.topk(mass, min(top, int((count > 0).sum()))).indices.tolist())
    kept = torch.tensor(sorted(keep), dtype=torch.long)
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


# ---- moving the kept rows to the host ----------------------------------------------------------------
def capture_pass(
    p, sel: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, values: dict | None = None
) -> CapturedBatch:
    """A tracked pass as numpy for the writer thread: [N, T] arrays, or with `sel` = (rows, positions,
    codes) only the kept rows, gathered on the device first so only they cross to the host. `values`: the
    pass's token_values, if already computed."""
    v = token_values(p) if values is None else values
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


def kept_rows(passes: list, k: int) -> int:
    """How many token rows a budget of k keeps: every recorded row if they fit, else exactly k (the
    sequences fill at most their quota and the ranking the rest, from more candidates than it needs)."""
    n_rows = sum(int(p.mask.sum()) for p in passes)
    return n_rows if n_rows <= k else k


@dataclass
class BudgetOutput:
    """A budgeted step on the host: the kept rows per pass, the exact token statistics of the steps
    table, the prob_bins rows and the vocab arrays."""

    batches: list[CapturedBatch]
    scalars: dict[str, float]
    prob_bins: list[dict]
    vocab: dict[str, np.ndarray]


class BudgetedStep:
    """The kept rows and exact aggregates of a budgeted step. `n_rows` (the kept rows) is known at once;
    `result()` computes the rest once: here, at the end of the step, for tensors on an accelerator (their
    memory is the training's), else on first call, i.e. on the writer thread."""

    def __init__(self, passes: list, budget: Budget, step: int, rank: int, edges: tuple[float, ...]):
        self.n_rows = kept_rows(passes, budget.k)
        self._args = (passes, budget, step, rank, edges)
        self._lock = threading.Lock()
        self._out: BudgetOutput | None = None
        self._error: BaseException | None = None
        if any(p.mask.device.type != "cpu" for p in passes):
            self.result()

    def result(self) -> BudgetOutput:
        with self._lock:
            if self._out is None and self._error is None:
                try:
                    self._out = budget_step(*self._args)
                except Exception as err:  # every table that needs it fails alike (counted by the writer)
                    self._error = err
                self._args = None  # the step's tensors are freed once computed
            if self._error is not None:
                raise self._error
            return self._out


def budget_step(passes: list, budget: Budget, step: int, rank: int, edges: tuple[float, ...]) -> BudgetOutput:
    """Everything a budgeted step records: the exact aggregates over all tokens, then the kept rows."""
    values = [token_values(p) for p in passes]
    finite = finite_columns(values)
    signs = [_sign_index(v, p.mask) for p, v in zip(passes, values)]  # [N, T] each
    scalars = step_aggregates(passes, values, finite)
    bins = prob_bin_rows(passes, values, budget.prob_bins, step, rank, finite, signs)
    vocab = vocab_arrays(passes, values, edges, budget.vocab_top, finite, signs)
    sel = select_rows(passes, values, budget, step, rank)
    batches = [capture_pass(p, s, v) for p, s, v in zip(passes, sel, values)]
    return BudgetOutput(batches, scalars, bins, vocab)


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
