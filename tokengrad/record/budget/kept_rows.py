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
import torch

from tokengrad.record.budget.aggregates import (
    finite_columns,
    prob_bin_rows,
    sign_index,
    step_aggregates,
    vocab_arrays,
)
from tokengrad.record.store.rows import CapturedBatch

ALL, SEQUENCE = 0, 1  # codes of rows.SELECTED_BY; 2.. are the ranking's


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
        pass_id=p.pass_id,
        update_id=p.update_id,
        token_ids=take(p.token_ids),
        mask=p.mask.cpu().numpy() if sel is None else p.mask[rows, pos].cpu().numpy(),
        in_loss=take(p.in_loss),
        sample_ids=p.sample_ids.cpu().numpy(),
        group_ids=p.group_ids.cpu().numpy(),
        values={k: take(v[k].float()) for k in names},
        clipped=None if p.clipped is None else take(p.clipped),
        extra={k: take(t) for k, t in p.extra.items()},
        index=None if sel is None else (sel[0].cpu().numpy(), sel[1].cpu().numpy()),
        selected_by=None if sel is None else sel[2].cpu().numpy(),
        policy_versions=None if p.policy_versions is None else p.policy_versions.numpy(),
        trainer_version=p.trainer_version,
    )


def kept_rows(passes: list, k: int) -> int:
    """How many token rows a budget of k keeps: every recorded row if they fit, else exactly k (the
    sequences fill at most their quota and the ranking the rest, from more candidates than it needs)."""
    n_rows = sum(int(p.mask.sum()) for p in passes)
    return n_rows if n_rows <= k else k


@dataclass(kw_only=True)
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
    signs = [sign_index(v, p.mask) for p, v in zip(passes, values)]  # [N, T] each
    scalars = step_aggregates(passes, values, finite)
    bins = prob_bin_rows(
        passes, values, n_bins=budget.prob_bins, step=step, rank=rank, finite=finite, signs=signs
    )
    vocab = vocab_arrays(passes, values, edges=edges, top=budget.vocab_top, finite=finite, signs=signs)
    sel = select_rows(passes, values, budget, step, rank)
    batches = [capture_pass(p, s, v) for p, s, v in zip(passes, sel, values)]
    return BudgetOutput(batches=batches, scalars=scalars, prob_bins=bins, vocab=vocab)
