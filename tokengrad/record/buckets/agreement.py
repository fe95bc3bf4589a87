"""Ranks agree before they enter a sequence of collectives, so that none waits forever for a rank that
will not come.

The sharded bucket analysis runs one backward pass per bucket on every rank, and each pass runs FSDP's
reduce-scatters: a rank that skipped the analysis (it tracked no pass for the update, or its step raised
between the backward and `record_grad_norms`) or died would leave the others blocked inside torch. Before
the passes every rank therefore posts its status on a side process group (gloo, with its own timeout) in
one all-reduce of a small vector; the passes start only when every rank is there and ready, else every
rank raises the same one-line error naming the ranks and why.

    agreement = RankAgreement.create()                 # at Recorder.open, on every rank (a collective)
    flags = agreement.agree("bucket analysis", step=3, status=READY, values=[1, 0, 1, 1])  # summed flags
    agreement.leave(step=3, n_values=4)                # a rank leaving the step early: the others stop

A rank that died is noticed by gloo as a closed connection (at once) or by the group's timeout;
`$TOKENGRAD_RANK_TIMEOUT_S` (default 600 s) bounds how long a rank waits for slower ones.
"""

from __future__ import annotations

import datetime
import os

import torch

from tokengrad.record import distributed as dist

READY, NO_PASS, LEFT = 1, 2, 3  # a rank's status in one agreement (0: the rank never posted)
_WHY = {NO_PASS: "tracked no pass of the update", LEFT: "left the step with an error"}
TIMEOUT_ENV = "TOKENGRAD_RANK_TIMEOUT_S"


class RankAgreementError(RuntimeError):
    """Some rank cannot take part in the collectives the others are about to enter: raised on every rank."""


class RankAgreement:
    """A gloo side group over all ranks (None in one process) on which ranks agree, with its timeout."""

    def __init__(self, group, timeout_s: float):
        self.group, self.timeout_s = group, timeout_s

    @classmethod
    def create(cls) -> "RankAgreement":
        """Every rank calls this at the same point (creating the group is a collective)."""
        timeout_s = float(os.environ.get(TIMEOUT_ENV, 600))
        if not (dist.group_ready() and dist.world_size() > 1):
            return cls(None, timeout_s)
        timeout = datetime.timedelta(seconds=timeout_s)
        return cls(torch.distributed.new_group(backend="gloo", timeout=timeout), timeout_s)

    def agree(self, what: str, *, step: int, status: int, values: list[float]) -> list[float]:
        """Post this rank's `status` and `values`; returns the values summed over ranks when every rank
        is READY, else raises RankAgreementError (on every rank: each sees the same statuses)."""
        if self.group is None:
            if status != READY:
                raise RankAgreementError(f"tokengrad: step {step}: {what}: this process {_WHY[status]}")
            return [float(v) for v in values]
        ws, me = dist.world_size(), dist.rank()
        vec = torch.zeros(ws + len(values), dtype=torch.float64)  # [W statuses | values]
        vec[me] = status
        vec[ws:] = torch.as_tensor(values, dtype=torch.float64)
        try:
            torch.distributed.all_reduce(vec, group=self.group)
        except RuntimeError as err:  # gloo: a peer closed its connection, or the timeout passed
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            raise RankAgreementError(
                f"tokengrad: step {step}: {what}: not every rank arrived within {self.timeout_s:g} s "
                f"(${TIMEOUT_ENV}); a rank died or left the step ({first}); no rank entered the "
                f"analysis's collectives, the rows recorded so far are kept"
            ) from None
        statuses = [int(s) for s in vec[:ws].tolist()]
        bad = {r: s for r, s in enumerate(statuses) if s != READY}
        if bad:
            named = "; ".join(f"rank {r} {_WHY.get(s, 'did not post')}" for r, s in sorted(bad.items()))
            raise RankAgreementError(
                f"tokengrad: step {step}: {what} skipped on every rank: {named} (each rank must track a "
                f"pass of the update and reach record_grad_norms); the rows recorded so far are kept"
            )
        return vec[ws:].tolist()

    def leave(self, *, step: int, n_values: int) -> None:
        """A rank leaving the step before the agreement: post LEFT so the others stop at once; its own
        error stays the one it raised (a failure here is ignored)."""
        try:
            self.agree("leaving", step=step, status=LEFT, values=[0.0] * n_values)
        except RankAgreementError:
            pass
