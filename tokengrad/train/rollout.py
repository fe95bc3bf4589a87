"""Rollouts: sample G completions per prompt (with tool turns), score them, and pack them into tensors.

    comps = generate_completions(model, tok, prompts, n_samples=G, max_new_tokens=256,
                                 sampling=sampling_kwargs(1.0, 1.0), task=task, max_turns=3)
    rollout = make_rollout(comps, task, problems, tok)                    # rewards [B, G], tensors [N, ...]
    logits, hidden = policy_forward(model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len)
    logprobs = gather_logprobs(logits, rollout.completion_ids)            # [N, T]

Layout of a packed sequence: left-padded prompt (P tokens), then the completion, right-padded (T tokens),
so every completion starts at column P. Tool output is part of the completion but has loss_mask 0: the
model reads it, the loss never trains on it (Search-R1's observation masking).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from tokengrad.train.tasks.base import Problem, Task


class Completions(NamedTuple):
    prompt_ids: list[list[int]]      # N rows: rendered prompt token ids
    completion_ids: list[list[int]]  # N rows: generated and tool-output tokens, in order
    loss_mask: list[list[int]]       # N rows: 1 = generated token, 0 = tool output
    texts: list[str]                 # N decoded completions (special tokens dropped)
    n_tool_calls: list[int]          # N


class Rollout(NamedTuple):
    input_ids: Tensor       # [N, P + T] prompt left-padded, completion right-padded
    attention_mask: Tensor  # [N, P + T] 1 = real token
    prompt_len: int         # P
    completion_ids: Tensor  # [N, T]
    mask: Tensor            # [N, T] float, 1 = completion token (generated or tool output)
    loss_mask: Tensor       # [N, T] float, 1 = generated token (in the loss)
    rewards: Tensor         # [B, G]
    correct: Tensor         # [B, G] bool
    problems: list          # B Problem
    texts: list[str]        # N completions
    n_tool_calls: list[int]  # N


def render_prompt(tokenizer, problem: Problem) -> str:
    """The prompt text the model sees: the chat template when the tokenizer has one, then the problem's
    response prefix (e.g. "<think>"), which the model continues."""
    messages = [{"role": "system", "content": problem.system}] if problem.system else []
    messages.append({"role": "user", "content": problem.prompt})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n\n".join(m["content"] for m in messages) + "\n"
    return text + problem.response_prefix


def encode_prompt(tokenizer, text: str) -> list[int]:
    # A chat template writes its own special tokens; plain prompts get the tokenizer's (e.g. BOS).
    return tokenizer(text, add_special_tokens=not getattr(tokenizer, "chat_template", None)).input_ids


def sampling_kwargs(temperature: float, top_p: float) -> dict:
    """generate() arguments for pure temperature/top-p sampling (top_k=0 switches off HF's default 50);
    temperature 0 means greedy decoding."""
    if temperature == 0:
        return dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    return dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return sorted({*ids, tokenizer.eos_token_id} - {None})


class _StopOnText(StoppingCriteria):
    """Per-row stop once the new text contains `stop`; remembers how many new tokens each row had then."""

    def __init__(self, tokenizer, stop: str, start: int):
        self.tok, self.stop, self.start = tokenizer, stop, start
        self.window = len(stop.encode("utf-8")) + 2   # every token decodes to >= 1 byte
        self.stop_at: dict[int, int] = {}

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> Tensor:
        n_new = input_ids.shape[1] - self.start
        tail = input_ids[:, max(self.start, input_ids.shape[1] - self.window):].tolist()
        for row, ids in enumerate(tail):
            if row not in self.stop_at and self.stop in self.tok.decode(ids):
                self.stop_at[row] = n_new
        return torch.tensor([row in self.stop_at for row in range(len(tail))], device=input_ids.device)


@contextlib.contextmanager
def _only_our_generation_config(model):
    """generate() fills unset values from model.generation_config, so a checkpoint's own defaults
    (repetition penalty, top_k, ...) would make the sampling policy differ from the pi the loss scores;
    an empty one is swapped in while generating."""
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


@torch.no_grad()
def _generate_turn(model, tokenizer, contexts: list[list[int]], max_new_tokens: int, sampling: dict,
                   stop: str | None) -> list[tuple[list[int], bool]]:
    """One generation turn for every context: (new token ids, stopped at `stop`) per row."""
    pad, eos = tokenizer.pad_token_id, eos_ids(model, tokenizer)
    pad = eos[0] if pad is None else pad
    L = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), L), pad, dtype=torch.long)  # [n, L] left-padded
    attn = torch.zeros_like(ids)
    for i, c in enumerate(contexts):
        ids[i, L - len(c):] = torch.tensor(c)
        attn[i, L - len(c):] = 1
    dev = model.device
    criteria = _StopOnText(tokenizer, stop, L) if stop else None
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos, use_cache=True, **sampling
    )
    with _only_our_generation_config(model):
        out = model.generate(
            input_ids=ids.to(dev),
            attention_mask=attn.to(dev),
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([criteria]) if criteria else None,
        )
    rows = []
    for i, new in enumerate(out[:, L:].tolist()):
        end = next((k + 1 for k, t in enumerate(new) if t in eos), len(new))  # keep the EOS: it is learned
        stop_at = criteria.stop_at.get(i) if criteria else None
        hit = stop_at is not None and stop_at <= end
        rows.append((new[:stop_at] if hit else new[:end], hit))
    return rows


def generate_completions(
    model,
    tokenizer,
    prompts: list[str],
    n_samples: int,
    max_new_tokens: int,
    sampling: dict,
    task: Task | None = None,
    max_turns: int = 1,
) -> Completions:
    """n_samples completions of every prompt (rows prompt-major: prompt b, sample g -> row b * G + g).

    For a task with `tool_stop`, a turn that ends with the stop string is answered by `task.tool(text)`
    (text = the completion so far); its reply is appended as tokens with loss_mask 0 and generation
    continues, up to `max_turns` turns and the task's `max_tool_calls` (if it has one). A reply of None
    ends the completion.
    """
    prompt_ids = [encode_prompt(tokenizer, p) for p in prompts for _ in range(n_samples)]
    comp = [[] for _ in prompt_ids]
    lmask = [[] for _ in prompt_ids]
    calls = [0] * len(prompt_ids)
    stop = getattr(task, "tool_stop", None) if task is not None else None
    max_calls = getattr(task, "max_tool_calls", None)
    max_calls = max_calls if max_calls is not None else max_turns
    active = list(range(len(prompt_ids)))
    for turn in range(max_turns):
        if not active:
            break
        new = _generate_turn(
            model, tokenizer, [prompt_ids[i] + comp[i] for i in active], max_new_tokens, sampling, stop
        )
        still = []
        for i, (ids, hit_stop) in zip(active, new):
            comp[i] += ids
            lmask[i] += [1] * len(ids)
            if not hit_stop or turn == max_turns - 1 or calls[i] >= max_calls:
                continue
            reply = task.tool(tokenizer.decode(comp[i], skip_special_tokens=True))
            if reply is None:
                continue
            info = tokenizer(reply, add_special_tokens=False).input_ids
            comp[i] += info
            lmask[i] += [0] * len(info)
            calls[i] += 1
            still.append(i)
        active = still
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in comp]
    return Completions(prompt_ids, comp, lmask, texts, calls)


def pack(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], loss_mask: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, int, Tensor, Tensor, Tensor]:
    """Rows of ids -> (input_ids [N, P+T], attention_mask, P, completion_ids [N, T], mask, loss_mask)."""
    N = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    input_ids = torch.full((N, P + T), pad_id, dtype=torch.long)  # [N, P + T]
    attn = torch.zeros((N, P + T), dtype=torch.long)  # [N, P + T]
    lm = torch.zeros((N, T))  # [N, T]
    for i, (p, c, m) in enumerate(zip(prompt_ids, completion_ids, loss_mask)):
        input_ids[i, P - len(p) : P + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, P - len(p) : P + len(c)] = 1
        lm[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    mask = attn[:, P:].float()  # [N, T]
    return input_ids, attn, P, input_ids[:, P:], mask, lm


def make_rollout(comps: Completions, task: Task, problems: list[Problem], tokenizer) -> Rollout:
    """Score every completion with the task's verifiable reward and pack the batch."""
    G = len(comps.texts) // len(problems)
    rewards = torch.tensor(
        [[float(task.reward(pr, comps.texts[b * G + g])) for g in range(G)] for b, pr in enumerate(problems)]
    )  # [B, G]
    correct = torch.tensor(
        [
            [bool(task.is_correct(pr, comps.texts[b * G + g])) for g in range(G)]
            for b, pr in enumerate(problems)
        ]
    )  # [B, G]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    packed = pack(comps.prompt_ids, comps.completion_ids, comps.loss_mask, pad)
    return Rollout(*packed, rewards, correct, list(problems), comps.texts, comps.n_tool_calls)


def policy_forward(
    model, input_ids: Tensor, attention_mask: Tensor, prompt_len: int
) -> tuple[Tensor, Tensor]:
    """Logits and final hidden states at the completion tokens: ([n, T, V] fp32, [n, T, D]).

    Runs the transformer body (under the caller's autocast) and the LM head in fp32 outside autocast:
    bf16 logits would put errors of a few percent on token probabilities, which the recorder reports.
    Only the T positions that predict completion tokens reach the head. Position ids follow the
    attention mask, as in generate(), so left padding does not shift the prompt's positions.
    Models with a logit transform after the head (soft-capping) are not supported.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [n, P + T]
    body = model.get_decoder()
    h = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    h = h[:, prompt_len - 1 : -1]  # [n, T, D]: position t predicts completion token t
    with torch.autocast(device_type=h.device.type, enabled=False):
        logits = model.get_output_embeddings()(h.float())  # [n, T, V]
    return logits, h


def gather_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token] without a second [n, T, V] tensor: gathered logit minus logsumexp."""
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # [n, T]
    return picked - logits.logsumexp(-1)  # [n, T]


def evaluate(
    model,
    tokenizer,
    task: Task,
    problems: list[Problem],
    max_new_tokens: int,
    max_turns: int,
    batch_size: int,
) -> dict[str, tuple[float, int]]:
    """Greedy accuracy per difficulty label: {difficulty: (accuracy, n)}."""
    hits: dict[str, list[bool]] = defaultdict(list)
    for lo in range(0, len(problems), batch_size):
        chunk = problems[lo : lo + batch_size]
        comps = generate_completions(
            model,
            tokenizer,
            [render_prompt(tokenizer, p) for p in chunk],
            1,
            max_new_tokens,
            sampling_kwargs(0.0, 1.0),
            task,
            max_turns,
        )
        for pr, text in zip(chunk, comps.texts):
            hits[str(pr.difficulty)].append(bool(task.is_correct(pr, text)))
    return {d: (sum(v) / len(v), len(v)) for d, v in sorted(hits.items())}
