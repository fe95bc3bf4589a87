"""One step's probability-bucket analysis (AR-Lopti, arXiv 2505.12929, Fig. 1): the bucket gradients of its
tracked passes, accumulated per optimizer update until that update's norms are read, the bucket rows built
from them, and the after-update change of probability per pi_old bucket."""

from __future__ import annotations

import torch

from tokengrad import schema
from tokengrad.record.buckets import analysis as bk
from tokengrad.record.buckets import sharded
from tokengrad.record.buckets.rows import BucketState, bucket_rows, figure_rows


def _distributed() -> bool:
    """Several processes: the bucket gradients are all-reduced before the shares, so none is derived."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class StepBuckets:
    """Bucket state of one step. `state`: update_id -> the bucket gradients accumulated so far; `rows`:
    the bucket rows finished so far; `in_backward`: a bucket backward is running (the coef hook must
    leave its gradients alone)."""

    def __init__(self, edges, step: int, rank: int):
        self.edges, self.step, self.rank = edges, step, rank
        self.state: dict[int, BucketState] = {}
        self.rows: list[dict] = []
        self.in_backward = False
        self._fresh: set[int] = set()  # updates whose gradients were empty before their first backward
        self._ours = False  # a backward of st.backward / the TRL attach is running
        self._hooks: list | None = None  # post-accumulate-grad hooks that see every backward into .grad
        # sharded gradients: update_id -> its passes, their graphs kept for the passes at the update's end
        self.deferred: dict[int, list] = {}

    def before_backward(self, passes, params: list[torch.Tensor]) -> None:
        """Called before the backward of `passes` not analysed yet: an update that begins with it begins
        from empty gradients (None or all 0) or its derived bucket is off (g would hold more than its
        passes)."""
        if _distributed():
            return
        for uid in {p.update_id for p in passes if not p.bucketed} - set(self.state):
            if all(q.grad is None or not bool(q.grad.any()) for q in params):
                self._fresh.add(uid)
        if self._hooks is None:
            self._hooks = [q.register_post_accumulate_grad_hook(self._accumulated) for q in params]
        self._ours = True

    def _accumulated(self, _param) -> None:
        """A gradient reached .grad: from a backward other than ours, g holds more than the passes, so
        no open update keeps a derived bucket."""
        if not self._ours:
            for state in self.state.values():
                if state.derived is not None:
                    state.derived_lost = True

    def close(self) -> None:
        """Remove the gradient hooks (end of step)."""
        for h in self._hooks or []:
            h.remove()
        self._hooks = None

    def analyze(self, passes, named_params, loss: torch.Tensor | None = None, sharded: bool = False) -> None:
        """Bucket gradients of the passes not analysed yet (their graphs must still exist). With the `loss`
        their backward ran on, an update shown residual-free (see bucket_analysis) derives one bucket as g
        minus the others instead of a pass of its own. `sharded` gradients (FSDP): the passes wait, graphs
        kept, for `finish_sharded` at the update's end (record/buckets/sharded.py)."""
        self._ours = False
        if sharded:
            for p in passes:
                if not p.bucketed:
                    p.bucketed = True
                    self.deferred.setdefault(p.update_id, []).append(p)
            return
        params = [p for _, p in named_params]
        todo = [p for p in passes if not p.bucketed]
        proven = (
            loss is not None and not _distributed() and bk.residual_free(loss, [p.logprobs for p in todo])
        )
        for p in todo:
            p.bucketed = True
            if p.coef is None or p.logprobs.grad_fn is None:
                self._state(p.update_id, None)
                continue
            idx = bk.bucket_index(p.tensors["prob"], self.edges)  # [N, T]
            whole = proven and bk.coef_is_whole(p.coef, p.in_loss)
            state = self._state(p.update_id, (p.coef, p.in_loss, idx) if whole else None)
            self.in_backward = True
            try:
                grads = bk.bucket_gradients(
                    p.logprobs,
                    p.coef,
                    in_loss=p.in_loss,
                    bucket=idx,
                    n_buckets=len(self.edges) - 1,
                    params=params,
                    skip=state.derived,
                )
            finally:
                self.in_backward = False
            bk.accumulate(state.grads, grads)
            for b in range(len(self.edges) - 1):
                state.n_tokens[b] += int(((idx == b) & p.in_loss).sum())

    def _state(self, update_id: int, whole) -> BucketState:
        """The update's state; its first pass picks the derived bucket when `whole` ((coef, in_loss,
        bucket) of a residual-free pass) and the gradients began empty; a later pass without `whole`
        loses an already derived bucket (its earlier passes made no pass for it)."""
        nb = len(self.edges) - 1
        if update_id not in self.state:
            state = self.state[update_id] = BucketState([None] * nb, [0] * nb)
            if whole is not None and update_id in self._fresh and bk.active_buckets(*whole, nb):
                state.derived = bk.largest_bucket(*whole, nb)
            return state
        state = self.state[update_id]
        if whole is None and state.derived is not None:
            state.derived_lost = True
        return state

    def agree_sharded(self, update_id: int, agreement, analyse: bool) -> tuple[list, list[int]]:
        """Before an update's norms are read from sharded gradients: the one agreement of the ranks
        (record/buckets/sharded.py); returns the update's deferred passes and the buckets every rank runs."""
        passes = self.deferred.pop(update_id, [])  # popped first: a failed agreement leaves none pending
        active = sharded.agree_on_buckets(
            passes, edges=self.edges, agreement=agreement, step=self.step, analyse=analyse
        )
        return passes, active

    def finish_sharded(self, update_id: int, model: torch.nn.Module, passes: list, active: list[int]) -> None:
        """The update's bucket rows from its deferred passes, streamed over the gradient shards; every rank
        calls it for every update of a bucket step (it runs collectives)."""
        res, n_tokens = sharded.sharded_bucket_figures(passes, model, edges=self.edges, active=active)
        self.rows += figure_rows(
            res, n_tokens, self.edges, step=self.step, rank=self.rank, update_id=update_id
        )

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
        dmean, correct = bk.prob_change(
            old, new_logprobs.detach().float(), advantages=adv, in_loss=in_loss, bucket=idx, n_buckets=nb
        )
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
