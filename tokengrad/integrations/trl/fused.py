"""What TRL's LM head knows about each token: sum_j p_j^2 and the LM-head input, or the logits themselves.

TRL >= 1.15 never materialises logits during the loss forward (its fused LM head, `add_fused_lm_head`);
`tokengrad.integrations.trl` reads these per-token extras through forward hooks that live only while
recording (removed in `remove()`). Earlier TRL (1.13, 1.14) scores the model's full logits: the same
hook reads them, and every statistic comes from them exactly (`tokengrad.record.stats.token_stats`).

Confident tokens: from the head's outputs alone |p - e_y| = sqrt(1 - 2p + sum_j p_j^2), which cancels in
fp32 once p > 1/2 (exactly 0 below 1 - p = 3.5e-5). For those rows the statistics are taken again from the
LM-head input, a few rows of logits at a time, by `tokengrad.record.stats`' cancellation-free sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokengrad.record.stats import CHUNK_ROWS, TokenStats, chunk_stats, token_stats

_LOGIT_SCALES = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)


class FusedCapture:
    """Per-token extras of TRL's fused LM head during the tracked loss forward.

    TRL never materialises logits: `add_fused_lm_head` makes `model(..., fused_lm_head=True)` return
    per-token fields. We re-add the head asking for `log_sum_sq_probs` too (log sum_j p_j^2, no grad) and
    read it, with the LM-head input (hidden states), through forward hooks while `start(True)` is on.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        model = trainer.model
        self.model = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.on = False
        self.outputs: list = []
        self.logits: list = []  # (logits, input_ids, attention_mask) per forward (a TRL without fused head)
        self.hidden: list = []
        self.handles: list = []
        self.old_forward = None

    def install(self) -> None:
        if "forward" in vars(self.model) and self._readd_head():
            self.handles.append(self.model.register_forward_hook(self._grab_output, with_kwargs=True))
        else:  # a TRL whose model returns full logits (no fused head to ask): read those
            self.handles.append(self.model.register_forward_hook(self._grab_logits, with_kwargs=True))
        cfg = getattr(self.model, "config", None)
        if cfg is not None and all(getattr(cfg, a, None) is None for a in _LOGIT_SCALES):
            # logits = (W h + b) / temperature exactly, so |dL/dW_t| = |dL/dz_t| |h_t| / temperature, and the
            # confident rows' logits can be taken again from h
            self.handles.append(self.model.base_model.register_forward_hook(self._grab_hidden))

    def _readd_head(self) -> bool:
        import inspect

        from trl.trainer import utils as trl_utils

        add = getattr(trl_utils, "add_fused_lm_head", None)
        if add is None or "outputs" not in inspect.signature(add).parameters:
            return False
        self.old_forward = vars(self.model)["forward"]
        add(
            self.model,
            temperature=self.trainer.temperature,
            cast_lm_head_to_fp32=getattr(self.trainer.args, "cast_lm_head_to_fp32", False),
            outputs=("log_probs", "entropy", "log_sum_sq_probs"),
        )
        return True

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        if self.old_forward is not None:
            self.model.forward = self.old_forward

    def _grab_output(self, module, args, kwargs, output) -> None:
        if self.on and kwargs.get("fused_lm_head"):
            self.outputs.append(getattr(output, "log_sum_sq_probs", None))

    def _grab_logits(self, module, args, kwargs, output) -> None:
        logits, ids = getattr(output, "logits", None), kwargs.get("input_ids", args[0] if args else None)
        if self.on and torch.is_tensor(logits) and logits.dim() == 3 and torch.is_tensor(ids):
            # a reference only: TRL holds these logits until its log-prob call returns (stop() reads them)
            self.logits.append((logits, ids, kwargs.get("attention_mask")))

    def _grab_hidden(self, module, args, output) -> None:
        if self.on:
            self.hidden.append(getattr(output, "last_hidden_state", None))

    def start(self, on: bool) -> None:
        self.on, self.outputs, self.logits, self.hidden = on, [], [], []

    def stop(self, keep: int) -> "Captured":
        """What the head saw for the last `keep` scored positions (fields None where not available)."""
        self.on = False
        sum_p2 = hidden = None
        if self.outputs and all(o is not None for o in self.outputs):
            sum_p2 = torch.cat([o[:, -keep:] for o in self.outputs]).detach().float().exp()  # [B, K]
        if self.hidden and all(h is not None for h in self.hidden):
            # position t of the completion is scored from the hidden state one step earlier
            hidden = torch.cat([x[:, -keep - 1 : -1] for x in self.hidden]).detach()  # [B, K, D]
        stats = self._logit_stats(keep)
        self.outputs, self.logits, self.hidden = [], [], []
        head = self.model.get_output_embeddings() if hidden is not None else None
        fp32 = bool(getattr(self.trainer.args, "cast_lm_head_to_fp32", False))
        temperature = float(self.trainer.temperature)
        return Captured(
            sum_p2=sum_p2, hidden=hidden, head=head, temperature=temperature, fp32_head=fp32, stats=stats
        )

    def _logit_stats(self, keep: int) -> TokenStats | None:
        """TokenStats [B, K] from the full logits TRL scored (TRL < 1.15), at its temperature; else None."""
        if not self.logits:
            return None
        parts = []
        for logits, ids, att in self.logits:
            # position t of the completion is scored by the logits one step earlier, divided by TRL's
            # temperature as its log-probs are (a model honouring logits_to_keep returns K + 1 rows)
            z = logits.detach()[:, :-1][:, -keep:] / float(self.trainer.temperature)  # [b, K, V]
            mask = None if att is None else att[:, -keep:]  # [b, K]
            parts.append(token_stats(z, ids[:, -keep:], mask))
        return TokenStats(*(torch.cat(f) for f in zip(*parts)))


@dataclass(frozen=True, kw_only=True)
class Captured:
    sum_p2: torch.Tensor | None  # [B, K] sum_j p_j^2 from the fused head
    hidden: torch.Tensor | None  # [B, K, D] LM-head input (only for heads without logit scaling)
    head: torch.nn.Module | None  # the output projection
    temperature: float
    fp32_head: bool = False  # TRL runs the head in fp32 (cast_lm_head_to_fp32), else in its dtype
    stats: TokenStats | None = None  # every statistic, from full logits (a TRL without the fused head)

    @property
    def head_input(self) -> torch.Tensor | None:
        """h / temperature [B, K, D]: what multiplies W in the logits, for the head gradient norm."""
        return None if self.hidden is None else self.hidden / self.temperature


def fused_token_stats(
    logps: torch.Tensor, entropies, captured: Captured, token_ids: torch.Tensor, mask: torch.Tensor
) -> TokenStats | None:
    """TokenStats of TRL's loss pass: its log-probs and entropies, sum_j p_j^2 of the fused head, and the
    gradient unit; rows with p > 1/2 get exact entropy, sum_p2 and unit from their logits taken again.
    Where TRL scored full logits, the statistics of those logits."""
    if captured.stats is not None:
        return captured.stats
    sum_p2 = captured.sum_p2
    if entropies is None or sum_p2 is None:
        return None
    lp = logps.detach().float()  # [B, T]
    p = lp.exp()
    ent = entropies.detach().float().clone()  # [B, T]
    sum_p2 = sum_p2.clone()
    unit = (1.0 - 2.0 * p + sum_p2).clamp_min(0.0).sqrt()  # exact while p <= 1/2 (no cancellation)
    weight = _head_weight(captured)
    if weight is not None:
        rows = (p > 0.5) & mask.bool()  # [B, T]
        h, s2, u = _confident_stats(captured, weight, captured.hidden[rows], token_ids[rows])
        ent[rows], sum_p2[rows], unit[rows] = h, s2, u
    return TokenStats(logprob=lp, prob=p, entropy=ent, sum_p2=sum_p2, logit_grad_unit=unit)


def _head_weight(captured: Captured) -> torch.Tensor | None:
    """The [V, D] head weight in the dtype TRL's head computes in, or None where it cannot be had whole."""
    if captured.hidden is None or captured.head is None:
        return None
    w = captured.head.weight.detach()
    if hasattr(w, "full_tensor"):  # FSDP2 shards the head as a DTensor; TRL's head gathers it the same way
        w = w.full_tensor()
    if w.dim() != 2 or w.shape[1] != captured.hidden.shape[-1]:  # a flattened (FSDP1) shard
        return None
    return w.float() if captured.fp32_head else w


@torch.no_grad()
def _confident_stats(
    captured: Captured,
    weight: torch.Tensor,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    chunk_rows: int = CHUNK_ROWS,
):
    """(entropy, sum_p2, unit) [M] of M rows from their LM-head input [M, D], a [chunk, V] block at a time.

    The logits are W h (+ b) in the head's compute dtype, as TRL's fused head forms them, then fp32 / T."""
    bias = captured.head.bias  # [V] or None
    M, V = hidden.shape[0], weight.shape[0]
    out = torch.empty(3, M, dtype=torch.float32, device=hidden.device)  # [3, M]
    c = max(1, min(chunk_rows, M))
    d = torch.empty(c, V, dtype=torch.float32, device=hidden.device)  # [c, V] reused buffers
    e = torch.empty_like(d)
    for s in range(0, M, c):
        k = min(c, M - s)
        z = torch.mm(hidden[s : s + k].to(weight.dtype), weight.t())  # [k, V]
        if bias is not None:
            z = z + bias.to(z.dtype)
        z = z.float().div_(captured.temperature)
        _, ent, s2, unit = chunk_stats(z, ids[s : s + k], d[:k], e[:k])
        out[:, s : s + k] = torch.stack([ent, s2, unit])
    return out[0], out[1], out[2]
