"""One tracked backward pass while its step is open: the log-probs with their graph, the detached value
columns, masks and ids, and the coef the autograd hook fills in (tensors stay on their device until the
step ends); `build_pass` makes one from st.track()'s arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokengrad.record.checks import as_ids, check_ids, check_track_inputs
from tokengrad.record.stats import pass_values


@dataclass
class TrackedPass:
    """A tracked pass while the step is open (tensors stay on their device until the step ends)."""

    pass_id: int
    update_id: int
    logprobs: torch.Tensor  # [N, T] with graph (dropped after the backward)
    tensors: dict[str, torch.Tensor]  # [N, T] detached values
    token_ids: torch.Tensor
    mask: torch.Tensor  # [N, T] bool
    in_loss: torch.Tensor  # [N, T] bool
    sample_ids: torch.Tensor  # [N]
    group_ids: torch.Tensor  # [N]
    scale: torch.Tensor | None
    clipped: torch.Tensor | None
    extra: dict[str, torch.Tensor]
    coef: torch.Tensor | None = None  # [N, T] filled by the hook
    handle: object = None
    bucketed: bool = False
    recompute: object = None  # () -> [N, T] log pi again, for attribution (and on-spike) steps
    policy_versions: torch.Tensor | None = None  # [N] float64, NaN: unknown (tokens.policy_version)
    trainer_version: int | None = None  # tokens.trainer_version of every row


def new_pass(
    index, logprobs, tensors, token_ids, mask, in_loss, ids, scale_grad, clipped, extra
) -> TrackedPass:
    """Pass number `index` of the step (update 0 until the caller says otherwise); `ids`: (sample_ids,
    group_ids), each [N]."""
    return TrackedPass(
        index,
        0,
        logprobs,
        tensors,
        token_ids.detach(),
        mask,
        in_loss,
        *ids,
        None if scale_grad is None else scale_grad.detach().to(logprobs.dtype),
        None if clipped is None else clipped.detach().to(torch.bool),
        {k: v.detach() for k, v in (extra or {}).items()},
    )


def build_pass(index: int, logprobs: torch.Tensor, inputs: dict, stats) -> TrackedPass:
    """Pass `index` from st.track()'s arguments (`inputs`: its keyword tensors by name, `stats` its
    TokenStats), after checking every shape, device and id: the masks as bool, the detached value columns
    (record/stats.py) and the host trainer's own per-token tensors."""
    inputs = dict(inputs)
    versions = inputs.pop("policy_versions", None), inputs.pop("trainer_version", None)
    N, T = check_track_inputs(logprobs, **inputs)
    dev = logprobs.device
    mask = inputs["mask"]
    mask_b = torch.ones(N, T, dtype=torch.bool, device=dev) if mask is None else mask.to(torch.bool)
    logits = inputs["logits"]
    # a model's vocabulary may be larger than its tokenizer's, so only logits give the bound
    vocab = logits.shape[-1] if logits is not None else None
    ids = (as_ids(inputs["sample_ids"], N, dev), as_ids(inputs["group_ids"], N, dev))
    check_ids(inputs["token_ids"], mask_b, vocab, ids[0])
    loss_mask = inputs["loss_mask"]
    in_loss = mask_b if loss_mask is None else (loss_mask.to(torch.bool) & mask_b)
    keys = ("old_logprobs", "ref_logprobs", "advantages", "weights", "logits")
    tensors = pass_values(
        logprobs, inputs["token_ids"], mask_b, *(inputs[k] for k in keys), stats, inputs["hidden"]
    )
    host = {"rollout_logprob": "rollout_logprobs", "is_weight": "is_weights", "mask_code": "mask_codes"}
    tensors.update({col: inputs[k].detach().float() for col, k in host.items() if inputs[k] is not None})
    p = new_pass(
        index,
        logprobs,
        tensors,
        inputs["token_ids"],
        mask_b,
        in_loss,
        ids,
        inputs["scale_grad"],
        inputs["clipped"],
        inputs["extra"],
    )
    p.policy_versions, p.trainer_version = check_versions(*versions, N)
    return p


def check_versions(policy_versions, trainer_version, n: int) -> tuple[torch.Tensor | None, int | None]:
    """st.track's version arguments: `policy_versions` an int (every row) or [N] numbers (NaN or None:
    unknown), `trainer_version` an int; ([N] float64 on the CPU or None, int or None)."""
    if trainer_version is not None and not (_is_int(trainer_version) and int(trainer_version) >= 0):
        raise ValueError(f"trainer_version must be an int >= 0, got {trainer_version!r}")
    if policy_versions is None:
        return None, None if trainer_version is None else int(trainer_version)
    if _is_int(policy_versions):
        v = torch.full((n,), float(policy_versions), dtype=torch.float64)  # [N]
    elif isinstance(policy_versions, (bool, float, str)):
        raise ValueError(f"policy_versions must be an int or [N] whole numbers, got {policy_versions!r}")
    else:
        if not torch.is_tensor(policy_versions):
            policy_versions = torch.tensor(
                [float("nan") if x is None else float(x) for x in policy_versions], dtype=torch.float64
            )
        v = policy_versions.detach().to("cpu", torch.float64).reshape(-1)  # [N]
        if v.numel() != n:
            raise ValueError(f"policy_versions has {v.numel()} entries, expected [N] = ({n},)")
    known = v[~torch.isnan(v)]
    if bool((known != known.round()).any()) or bool((known < 0).any()):
        raise ValueError("policy_versions must be whole numbers >= 0 (NaN or None: unknown)")
    return v, None if trainer_version is None else int(trainer_version)


def _is_int(x) -> bool:
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (torch.is_tensor(x) and x.dim() == 0 and not x.is_floating_point())
