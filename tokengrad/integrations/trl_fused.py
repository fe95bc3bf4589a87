"""What TRL's fused LM head knows about each token: sum_j p_j^2 and the LM-head input.

TRL never materialises logits during the loss forward; `tokengrad.integrations.trl` reads these per-token
extras through forward hooks that live only while recording (removed in `remove()`).
"""

from __future__ import annotations

import torch

from tokengrad.record.stats import TokenStats

_LOGIT_SCALES = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                 "logits_scaling")


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
        self.hidden: list = []
        self.handles: list = []
        self.old_forward = None

    def install(self) -> None:
        if "forward" in vars(self.model) and self._readd_head():
            self.handles.append(self.model.register_forward_hook(self._grab_output, with_kwargs=True))
        cfg = getattr(self.model, "config", None)
        if cfg is not None and all(getattr(cfg, a, None) is None for a in _LOGIT_SCALES):
            # logits = W h / temperature exactly, so |dL/dW_t| = |dL/dz_t| |h_t| / temperature
            self.handles.append(self.model.base_model.register_forward_hook(self._grab_hidden))

    def _readd_head(self) -> bool:
        import inspect

        from trl.trainer import utils as trl_utils

        add = getattr(trl_utils, "add_fused_lm_head", None)
        if add is None or "outputs" not in inspect.signature(add).parameters:
            return False
        self.old_forward = vars(self.model)["forward"]
        add(self.model, temperature=self.trainer.temperature,
            cast_lm_head_to_fp32=getattr(self.trainer.args, "cast_lm_head_to_fp32", False),
            outputs=("log_probs", "entropy", "log_sum_sq_probs"))
        return True

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        if self.old_forward is not None:
            self.model.forward = self.old_forward

    def _grab_output(self, module, args, kwargs, output) -> None:
        if self.on and kwargs.get("fused_lm_head"):
            self.outputs.append(getattr(output, "log_sum_sq_probs", None))

    def _grab_hidden(self, module, args, output) -> None:
        if self.on:
            self.hidden.append(getattr(output, "last_hidden_state", None))

    def start(self, on: bool) -> None:
        self.on, self.outputs, self.hidden = on, [], []

    def stop(self, keep: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(sum_p2 [B, K], hidden / temperature [B, K, D]) of the last `keep` scored positions, or None."""
        self.on = False
        sum_p2 = hidden = None
        if self.outputs and all(o is not None for o in self.outputs):
            sum_p2 = torch.cat([o[:, -keep:] for o in self.outputs]).detach().float().exp()   # [B, K]
        if self.hidden and all(h is not None for h in self.hidden):
            # position t of the completion is scored from the hidden state one step earlier
            h = torch.cat([x[:, -keep - 1:-1] for x in self.hidden]).detach()                # [B, K, D]
            hidden = h / self.trainer.temperature
        self.outputs, self.hidden = [], []
        return sum_p2, hidden


def fused_token_stats(logps: torch.Tensor, entropies, sum_p2) -> TokenStats | None:
    if entropies is None or sum_p2 is None:
        return None
    lp = logps.detach().float()                                                     # [B, T]
    p = lp.exp()
    unit = (1.0 - 2.0 * p + sum_p2).clamp_min(0.0).sqrt()  # clamp: rounds below 0 as p -> 1
    return TokenStats(lp, p, entropies.detach().float(), sum_p2, unit)
