"""The one log-prob path of the trained policy: pi_old scoring, pi_ref, the loss pass and the prob-change
pass all call `token_logprobs`, so the first pass of an update sees ratio exactly 1.0 on every token.

    logits, hidden = policy_forward(model, input_ids, attention_mask, prompt_len)   # model's own transform
    out = token_logprobs(forward, ids, attn, P, completion_ids, temperature=0.7)    # log softmax(z / T)

Why one function: two routes to the same number (a gather of log_softmax, a fused chunked pass) differ by a
few ulps on 10-19% of tokens, and that noise is then all the signal KL-Cov's |log r| sees on-policy.

Why the temperature: the sampler draws from softmax(z / T); the ratio, pi_ref, the rules' p and the recorded
prob/entropy/sum_p2 must describe that same distribution, as TRL and verl do (they divide the fp32 logits by
T before the log-softmax).

Logit transforms: some families change the logits after the LM head (Gemma-2's final soft-capping
z <- c tanh(z / c), Cohere's z <- s z, Granite's z <- z / s). generate() applies them through the model's
own forward; `policy_forward` applies the same transform, read from the model config, so the trained and
the sampled policy agree.
"""

from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from tokengrad.record.fused_logprobs import logprobs_with_stats
from tokengrad.record.stats import TokenStats
from tokengrad.train import prompt_sharing


def _softcap(logits: Tensor, cap: float) -> Tensor:
    """Gemma-2 final_logit_softcapping (arXiv 2408.00118): cap * tanh(z / cap)."""
    return torch.tanh(logits / cap) * cap


def _scale(logits: Tensor, s: float) -> Tensor:
    """Cohere (Command-R) logit_scale: z * s."""
    return logits * s


def _divide(logits: Tensor, s: float) -> Tensor:
    """Granite logits_scaling: z / s."""
    return logits / s


# config attribute -> transform applied after the LM head (None in the config: no transform)
LOGIT_TRANSFORMS: dict[str, Callable[[Tensor, float], Tensor]] = {
    "final_logit_softcapping": _softcap,
    "logit_scale": _scale,
    "logits_scaling": _divide,
}


def logit_transforms(model) -> list[tuple[Callable[[Tensor, float], Tensor], float]]:
    """The post-head transforms `model`'s own forward applies, from its config, in a fixed order."""
    config = getattr(model, "config", None)
    found = []
    for name, fn in LOGIT_TRANSFORMS.items():
        value = getattr(config, name, None)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value == 0:
            raise ValueError(f"model config {name} = {value!r}: expected a non-zero number")
        found.append((fn, float(value)))
    return found


def policy_forward(
    model, input_ids: Tensor, attention_mask: Tensor, prompt_len: int
) -> tuple[Tensor, Tensor]:
    """Logits and final hidden states at the completion tokens: ([n, T, V] fp32, [n, T, D]).

    Runs the transformer body (under the caller's autocast) and the LM head in fp32 outside autocast:
    bf16 logits would put errors of a few percent on token probabilities, which the recorder reports.
    Only the T positions that predict completion tokens reach the head. Position ids follow the
    attention mask, as in generate(), so left padding does not shift the prompt's positions. The
    model's post-head logit transforms (`LOGIT_TRANSFORMS`) are applied in fp32. Rows that share a
    prompt (a group's G completions) run it once and read its keys and values
    (`tokengrad.train.prompt_sharing`): the same function, with the prompt's forward and backward divided
    by G.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [n, P + T]
    body = model.get_decoder()
    h = prompt_sharing.shared_hidden(body, input_ids, attention_mask, position_ids, prompt_len)
    if h is None:
        h = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        h = h.last_hidden_state[:, prompt_len - 1 : -1]  # [n, T, D]: position t predicts completion token t
    with torch.autocast(device_type=h.device.type, enabled=False):
        logits = model.get_output_embeddings()(h.float())  # [n, T, V]
        for fn, value in logit_transforms(model):
            logits = fn(logits, value)
    return logits, h


def gather_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token] without a second [n, T, V] tensor: gathered logit minus logsumexp."""
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # [n, T]
    return picked - logits.logsumexp(-1)  # [n, T]


def directional_logprobs(
    model,
    input_ids: Tensor,
    *,
    attention_mask: Tensor,
    prompt_len: int,
    completion_ids: Tensor,
    temperature: float = 1.0,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """[n, T] the same log-probs as `token_logprobs` by the plain route (gather minus logsumexp): the fused
    pass is a custom autograd.Function without a forward-mode rule, and per-token attribution takes a
    directional derivative of this (record/attribution/shares.py). The two routes agree to rounding. With
    `entropy`, the pair (log-probs, entropy of softmax(z / T)) [n, T] each, for entropy attribution."""
    with autocast():
        logits, _ = policy_forward(model, input_ids, attention_mask, prompt_len)  # [n, T, V]
    if temperature != 1.0:
        logits = logits.float() / temperature
    lp = gather_logprobs(logits, completion_ids)  # [n, T]
    return (lp, softmax_entropy(logits)) if entropy else lp


def softmax_entropy(logits: Tensor) -> Tensor:
    """[n, T] H = logsumexp(z) - sum_v softmax(z)_v z_v, differentiable in both AD modes."""
    log_p = torch.log_softmax(logits.float(), -1)  # [n, T, V]
    return -(log_p.exp() * log_p).sum(-1)


def logprob_temperature(sampling_temperature: float) -> float:
    """The T the trained log-probs divide by: the sampler's, or 1 for greedy decoding (T = 0)."""
    return sampling_temperature if sampling_temperature > 0 else 1.0


class PolicyOutput(NamedTuple):
    logprobs: Tensor  # [n, T] log softmax(z / T)[token], fp32, differentiable
    stats: TokenStats  # prob, entropy, sum_p2, ... of softmax(z / T), no grad
    hidden: Tensor  # [n, T, D] hidden states feeding the LM head


def token_logprobs(
    forward: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]],
    input_ids: Tensor,
    *,
    attention_mask: Tensor,
    prompt_len: int,
    completion_ids: Tensor,
    temperature: float = 1.0,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> PolicyOutput:
    """Log-probs of `completion_ids` under softmax(logits / temperature), with the recorder's statistics.

    `forward(ids, attn, P)` returns (fp32 logits, hidden) (`policy_forward` bound to a model, or its DDP
    wrapper); it runs under `autocast()`, the log-softmax in fp32 outside it.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    with autocast():
        logits, hidden = forward(input_ids, attention_mask, prompt_len)  # [n, T, V]
    if temperature != 1.0:
        logits = logits.float() / temperature  # fp32 division, as TRL and verl
    logprobs, stats = logprobs_with_stats(logits, completion_ids)  # [n, T]
    return PolicyOutput(logprobs, stats, hidden)


@torch.no_grad()
def score_logprobs(
    model,
    input_ids: Tensor,
    *,
    attention_mask: Tensor,
    prompt_len: int,
    completion_ids: Tensor,
    chunks: list[Tensor],
    temperature: float = 1.0,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Tensor:
    """[N, T] log-probs of every row under `model`, scored chunk by chunk. Give the row chunks the loss
    passes will use: the same rows through the same function give bitwise the same numbers."""
    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)  # [N, T]
    forward = lambda ids, attn, p: policy_forward(model, ids, attn, p)  # noqa: E731
    for rows in chunks:
        if rows.numel():
            out[rows] = token_logprobs(
                forward,
                input_ids[rows],
                attention_mask=attention_mask[rows],
                prompt_len=prompt_len,
                completion_ids=completion_ids[rows],
                temperature=temperature,
                autocast=autocast,
            ).logprobs
    return out
