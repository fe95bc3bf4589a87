"""A group's shared prompt, run once: the G completions of a GRPO group start from the same prompt, whose
keys and values depend only on its own tokens (causal attention), so each distinct prompt runs once and its
cache is repeated for the rows that share it.

    h = shared_hidden(body, ids, attn, position_ids, P)     # the loss forward (tokengrad.train.policy)
    kwargs = shared_prefill(model, ids, attn)               # generate()'s cache (tokengrad.train.generation)

Both return nothing to share (None, {}) where every row's prompt is its own, under gradient checkpointing
(its recompute runs whole rows) and for a body that takes no key/value cache; the caller runs whole rows.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor


def shared_hidden(body, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, prompt_len: int):
    """[n, T, D] the hidden states at the positions that predict the completion tokens, each distinct
    prompt run once, or None (nothing to share: run whole rows)."""
    shared = shared_prompts(input_ids, attention_mask, prompt_len)
    if shared is None or any(getattr(m, "gradient_checkpointing", False) for m in body.modules()):
        return None
    return _hidden_from_cache(
        body, input_ids, attention_mask, position_ids=position_ids, prompt_len=prompt_len, shared=shared
    )


def shared_prompts(
    input_ids: Tensor, attention_mask: Tensor, prompt_len: int
) -> tuple[Tensor, Tensor] | None:
    """(first [U], inverse [n]) when the n rows hold only U < n distinct prompts (a GRPO group's G
    completions share one): row first[u] is prompt u's, row i has prompt inverse[i]. None when every row's
    prompt is its own, or there is no prompt."""
    if prompt_len < 2 or input_ids.shape[0] < 2:
        return None
    key = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], 1)  # [n, 2P]
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)  # [U, 2P], [n]
    if distinct.shape[0] == input_ids.shape[0]:
        return None
    rows = torch.arange(inverse.numel(), device=inverse.device)
    first = torch.full((distinct.shape[0],), inverse.numel(), device=inverse.device).scatter_reduce(
        0, inverse, rows, reduce="amin"
    )
    return first, inverse


def cache_keyword(module) -> str | None:
    """The keyword a model's forward takes its key/value cache by (transformers 5.25 renamed
    past_key_values to cache; the old name goes in 5.40), or None when it takes none."""
    params = inspect.signature(module.forward).parameters
    if "use_cache" not in params:
        return None
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def _hidden_from_cache(
    body, input_ids, attention_mask, *, position_ids, prompt_len: int, shared
) -> Tensor | None:
    """[n, T, D] the hidden states `policy_forward` reads, with each distinct prompt run once: its keys
    and values (with their graph) are repeated for the rows that share it, then the completions run on
    them. The same function as one pass over whole rows (causal attention: a prompt position never sees
    the completion), with the prompt's share of forward and backward divided by the group size. None
    when the body takes or returns no cache that can be repeated (the caller then runs whole rows)."""
    first, inverse = shared
    P = prompt_len
    name = cache_keyword(body)
    if name is None:  # a body without a key/value cache: the caller runs whole rows
        return None
    head = body(
        input_ids=input_ids[first, :P],
        attention_mask=attention_mask[first, :P],
        position_ids=position_ids[first, :P],
        use_cache=True,
    )
    cache = getattr(head, name, None)
    if not hasattr(cache, "batch_select_indices"):  # a model without a cache to share: one whole pass
        return None
    cache.batch_select_indices(inverse)  # [U, ...] -> [n, ...], differentiable indexing
    tail = body(
        input_ids=input_ids[:, P:],
        attention_mask=attention_mask,
        position_ids=position_ids[:, P:],
        use_cache=True,
        **{name: cache},
    ).last_hidden_state  # [n, T, D]
    last = head.last_hidden_state[inverse, P - 1 : P]  # [n, 1, D]: the last prompt position
    return torch.cat([last, tail[:, :-1]], 1)  # [n, T, D]


def shared_prefill(model, ids: Tensor, attn: Tensor) -> dict:
    """generate()'s cache keyword, holding the keys and values of every context but its last token, when
    rows share a context (a group's G samples of one prompt): each distinct context runs once and its
    cache is repeated for its rows, so generate() starts from the last token (the same function: a
    position's keys and values depend only on the tokens up to it). {} when every context is its own."""
    shared = shared_prompts(ids, attn, ids.shape[1])
    body = model.get_decoder()
    name = cache_keyword(body)
    if shared is None or name is None:
        return {}
    first, inverse = shared
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)  # [n, L] as policy_forward and generate() number them
    out = body(
        input_ids=ids[first, :-1],
        attention_mask=attn[first, :-1],
        position_ids=position_ids[first, :-1],
        use_cache=True,
    )
    cache = getattr(out, name, None)
    if not hasattr(cache, "batch_select_indices"):
        return {}
    cache.batch_select_indices(inverse)  # [U, ...] -> [n, ...]
    return {name: cache}
