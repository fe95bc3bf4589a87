"""Each token's exact share of an update, for every token at once, from one directional derivative.

The loss reaches the parameters through the per-token log-probs (plus terms not built on log pi), so

    g = sum_t coef_t grad log pi_t  (+ residual),      coef_t = dL/dlog pi_t,
    update_share_t = coef_t <grad log pi_t, g> / |g|^2,   sum_t update_share_t + residual = 1

(the per-bucket identity of AR-Lopti's Fig. 1, arXiv 2505.12929, refined to single tokens). The inner
products <grad log pi_t, g> of all tokens are one Jacobian-vector product of the map theta -> log pi [N, T]
along g: `directional_logprobs(model, recompute, g)` evaluates it by

- "jvp": forward-mode AD (torch.autograd.forward_ad). The parameters become dual tensors sharing storage
  with theta and g (no copy), the caller's `recompute()` runs once under `torch.func.functional_call`,
  and the tangent of its output is J g, exact to floating-point rounding. Attention runs in SDPA's math
  kernel: the fused CPU/GPU kernels have no forward-mode derivative.
- "central_difference": (log pi(theta + h v) - log pi(theta - h v)) / 2h with h = eps |theta| / |v|, two
  plain forwards that work with any kernel. Its error is truncation (h^2 / 6) d^3 log pi[v, v, v] ~ eps^2
  plus rounding ~ u / eps (u the unit roundoff of the parameter dtype), relative to the largest entry.
  Measured on tiny random Llamas (tests/record/test_attribution.py) against the JVP, in fp32: 0.7-1.2 % off at
  eps = 1e-3, 7e-4 to 1e-3 at 3e-4, 1e-4 at 1e-4, rising again below 3e-5 from rounding. The default
  eps = 0.02 u^(1/3) (1e-4 in fp32) sits at that minimum and scales with the dtype as the balance of the
  two terms does. It allocates one parameter-sized copy per forward.

Neither method touches the parameters themselves: both evaluate at substituted tensors, so theta is
bit-exactly what it was afterwards. Only torch; shapes are [N, T] for one tracked pass.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Callable

import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call

from tokengrad.registry import Registry

Recompute = Callable[[], torch.Tensor]  # () -> [N, T] log pi of the tracked pass at the current parameters
# (model, recompute, tangents {name: tensor}, eps) -> (log pi [N, T], d log pi along tangents [N, T])
Directional = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]
ATTRIBUTION_METHODS: Registry[Directional] = Registry("attribution method")


class _Call(torch.nn.Module):
    """Holds the model as a submodule so functional_call substitutes its parameters while `fn` runs (the
    model's own forward may not be what the caller uses to get log pi)."""

    def __init__(self, model: torch.nn.Module, fn: Recompute):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self) -> torch.Tensor:
        return self.fn()


def _math_attention() -> ExitStack:
    """SDPA's math kernel, the one with forward-mode derivatives (no-op where torch lacks the switch)."""
    stack = ExitStack()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch: attention falls back to the math path anyway
        return stack
    stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    return stack


def _run_at(model: torch.nn.Module, recompute: Recompute, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """recompute() with the model's parameters replaced by `params` (names as in named_parameters)."""
    out = functional_call(_Call(model, recompute), {f"model.{n}": t for n, t in params.items()}, ())
    if not torch.is_tensor(out) or out.dim() != 2:
        raise ValueError(
            f"recompute() must return the [N, T] log-probs of the pass, got "
            f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))}"
        )
    return out


@ATTRIBUTION_METHODS.register("jvp")
def jvp_logprobs(
    model: torch.nn.Module, recompute: Recompute, tangents: dict[str, torch.Tensor], eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward-mode AD: (log pi, J v) exact, for about the cost of 3 forwards (each matmul also multiplies
    the tangents). Parameters without a tangent keep theta and a zero tangent."""
    named = dict(model.named_parameters())
    with fwAD.dual_level(), torch.no_grad(), _math_attention():
        duals = {
            n: fwAD.make_dual(p.detach(), tangents[n].to(p.dtype)) if n in tangents else p.detach()
            for n, p in named.items()
        }
        try:
            out = _run_at(model, recompute, duals)
        except NotImplementedError as err:  # e.g. a custom autograd.Function without jvp (fused kernels)
            raise RuntimeError(
                f"forward-mode AD cannot pass through this model's recompute(): {err} Use "
                f"Attribution(method='central_difference') (plain forwards)."
            ) from err
        primal, tangent = fwAD.unpack_dual(out)
        if tangent is None:  # log pi does not depend on any parameter with a tangent
            tangent = torch.zeros_like(primal)
        return primal.detach().float(), tangent.detach().float()  # [N, T] each


EPS_FACTOR = 0.02  # calibrated so the fp32 step is 1e-4, the measured error minimum (module docs)


def default_eps(dtype: torch.dtype) -> float:
    """0.02 u^(1/3): truncation (~eps^2) and rounding (~u / eps) balance at eps ~ u^(1/3); the factor is
    the curvature of log pi along the update, measured on small models."""
    return EPS_FACTOR * float(torch.finfo(dtype).eps) ** (1.0 / 3.0)


@ATTRIBUTION_METHODS.register("central_difference")
def central_difference_logprobs(
    model: torch.nn.Module, recompute: Recompute, tangents: dict[str, torch.Tensor], eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two plain forwards at theta +- h v: ((f+ + f-) / 2, (f+ - f-) / 2h), both with error O(h^2) (see the
    module docs); h = eps |theta| / |v| over the parameters with a tangent."""
    named = {n: p.detach() for n, p in model.named_parameters()}
    if not tangents:
        out = _run_at(model, recompute, named).detach().float()
        return out, torch.zeros_like(out)
    dtype = next(iter(tangents.values())).dtype
    eps = default_eps(dtype) if eps is None else float(eps)
    # the norms in one fused pass each (a float64 copy of every tensor cost a quarter of a forward)
    v_sq = sq_norm(list(tangents.values()))
    th_sq = sq_norm([named[n] for n in tangents])
    if v_sq == 0.0:
        out = _run_at(model, recompute, named).detach().float()
        return out, torch.zeros_like(out)
    h = eps * math.sqrt(max(th_sq, 1.0)) / math.sqrt(v_sq)
    names = list(tangents)
    theta = [named[n] for n in names]
    v = [tangents[n].to(named[n].dtype) for n in names]
    outs = []
    with torch.no_grad():
        for sign in (1.0, -1.0):
            moved = {**named, **dict(zip(names, torch._foreach_add(theta, v, alpha=sign * h)))}
            outs.append(_run_at(model, recompute, moved).detach().double())
            del moved
    plus, minus = outs
    return ((plus + minus) / 2).float(), ((plus - minus) / (2 * h)).float()  # [N, T] each


def directional_logprobs(
    model: torch.nn.Module,
    recompute: Recompute,
    tangents: dict[str, torch.Tensor],
    method: str = "jvp",
    eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi [N, T], <grad log pi_t, v> [N, T]) of the pass `recompute()` scores, along `tangents`
    (parameter name -> v, names of model.named_parameters()), by the registered `method`."""
    return ATTRIBUTION_METHODS[method](model, recompute, tangents, eps)


def token_update_shares(coef: torch.Tensor, along_g: torch.Tensor, g_sq: float) -> torch.Tensor:
    """coef_t <grad log pi_t, g> / |g|^2 ([N, T]); NaN when the update had no gradient (shares undefined)."""
    if g_sq <= 0.0 or not math.isfinite(g_sq):
        return torch.full_like(along_g, math.nan)
    return (torch.nan_to_num(coef.float()) * along_g.float()) / g_sq  # [N, T]


def sq_norm(tensors) -> float:
    """sum of squares of a list of tensors, accumulated in float64 ([P] norms, one sync)."""
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return 0.0
    norms = torch._foreach_norm([t.float() if t.dtype != torch.float32 else t for t in tensors])
    return float(torch.stack(norms).double().pow(2).sum())
