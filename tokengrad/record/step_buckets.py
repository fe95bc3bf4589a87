"""One step's probability-bucket analysis (AR-Lopti, arXiv 2505.12929, Fig. 1): the bucket gradients of its
tracked passes, accumulated per optimizer update until that update's norms are read, the bucket rows built
from them, and the after-update change of probability per pi_old bucket."""

from __future__ import annotations

import torch

from tokengrad import schema
from tokengrad.record import bucket_analysis as bk
from tokengrad.record.bucket_rows import BucketState, bucket_rows


class StepBuckets:
    """Bucket state of one step. `state`: update_id -> the bucket gradients accumulated so far; `rows`:
    the bucket rows finished so far; `in_backward`: a bucket backward is running (the coef hook must
    leave its gradients alone)."""

    def __init__(self, edges, step: int, rank: int):
        self.edges, self.step, self.rank = edges, step, rank
        self.state: dict[int, BucketState] = {}
        self.rows: list[dict] = []
        self.in_backward = False

    def analyze(self, passes, named_params) -> None:
        """Bucket gradients of the passes not analysed yet (their graphs must still exist)."""
        params = [p for _, p in named_params]
        nb = len(self.edges) - 1
        for p in [p for p in passes if not p.bucketed]:
            p.bucketed = True
            if p.coef is None or p.logprobs.grad_fn is None:
                continue
            idx = bk.bucket_index(p.tensors["prob"], self.edges)  # [N, T]
            self.in_backward = True
            try:
                grads = bk.bucket_gradients(p.logprobs, p.coef, p.in_loss, idx, nb, params)
            finally:
                self.in_backward = False
            state = self.state.setdefault(p.update_id, BucketState([None] * nb, [0] * nb))
            bk.accumulate(state.grads, grads)
            for b in range(nb):
                state.n_tokens[b] += int(((idx == b) & p.in_loss).sum())

    def has_rows(self, update_id: int) -> bool:
        return any(r["update_id"] == update_id for r in self.rows)

    def finish_update(self, update_id: int, total: list[torch.Tensor]) -> None:
        """The update's bucket rows, against its total gradient `total` (one tensor per parameter)."""
        state = self.state.pop(update_id)
        self.rows += bucket_rows(
            state, total, self.edges, step=self.step, rank=self.rank, update_id=update_id
        )

    def prob_change(self, passes, new_logprobs: torch.Tensor, rows_ids: torch.Tensor) -> None:
        """Mean change of probability and correct ratio per pi_old bucket onto the last update's rows (see
        StepRecorder.record_prob_change)."""
        tracked = [
            (p.sample_ids, p.in_loss, p.tensors["old_logprob"], p.tensors.get("advantage"))
            for p in passes
            if "old_logprob" in p.tensors
        ]
        in_loss, old, adv = bk.union_of_passes(rows_ids, tracked, new_logprobs)
        nb = len(self.edges) - 1
        idx = bk.bucket_index(old.exp(), self.edges)  # [N, T] bucket of pi_old
        dmean, correct = bk.prob_change(old, new_logprobs.detach().float(), adv, in_loss, idx, nb)
        last = max([r["update_id"] for r in self.rows], default=max([p.update_id for p in passes], default=0))
        rows = [r for r in self.rows if r["update_id"] == last and r["bucket"] != schema.RESIDUAL_BUCKET]
        if not rows:  # no gradient analysis this step: rows with counts and the change only
            rows = self._count_rows(idx, in_loss, last)
            self.rows += rows
        for r, d, c in zip(rows, dmean, correct):
            r["dprob_mean"], r["correct_ratio"] = d, c

    def _count_rows(self, idx: torch.Tensor, in_loss: torch.Tensor, update_id: int) -> list[dict]:
        n = [int(((idx == b) & in_loss).sum()) for b in range(len(self.edges) - 1)]
        return [
            dict(
                step=self.step,
                rank=self.rank,
                update_id=update_id,
                bucket=schema.bucket_label(lo, hi),
                lo=lo,
                hi=hi,
                n_tokens=n[b],
                token_share=n[b] / max(sum(n), 1),
            )
            for b, (lo, hi) in enumerate(zip(self.edges, self.edges[1:]))
        ]
