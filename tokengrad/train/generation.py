"""Generation: sample G completions per prompt (with tool turns), score them, and pack them into a generation
batch of tensors.

    comps = generate_completions(model, tok, prompts, n_samples=G, max_new_tokens=256,
                                 sampling=sampling_kwargs(1.0, 1.0), task=task, max_turns=3)
    batch = make_generation_batch(comps, task, problems, tok)   # rewards [B, G], tensors [N, ...]

The log-probs of the trained policy come from `tokengrad.train.policy`; generation here also records, per
generated token, the log-prob under the distribution the sampler actually drew from (after temperature
and top-p, from the logits generate() computed, e.g. under bf16 autocast): `rollout_logprobs`. "Rollout"
names only the sampling engine's side (its log-probs, their gap to the trainer's); what one step trains on
is a generation batch.

Layout of a packed sequence: left-padded prompt (P tokens), then the completion, right-padded (T tokens),
so every completion starts at column P. Tool output is part of the completion but has loss_mask 0: the
model reads it, the loss never trains on it (Search-R1's observation masking).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from tokengrad.train import prompt_sharing
from tokengrad.train.policy import gather_logprobs, policy_forward  # noqa: F401  (importable from here too)
from tokengrad.train.tasks.base import Problem, Task


@dataclass(frozen=True, kw_only=True)
class Completions:
    prompt_ids: list[list[int]]  # N rows: rendered prompt token ids
    completion_ids: list[list[int]]  # N rows: generated and tool-output tokens, in order
    loss_mask: list[list[int]]  # N rows: 1 = generated token, 0 = tool output
    texts: list[str]  # N decoded completions (special tokens dropped)
    n_tool_calls: list[int]  # N
    rollout_logprobs: list[list[float]]  # N rows: sampler's log-prob of each token (NaN: tool output, greedy)


class GenerationBatch(NamedTuple):
    """One step's generated rows, packed: what the loss forward and the recorder read."""

    input_ids: Tensor  # [N, P + T] prompt left-padded, completion right-padded
    attention_mask: Tensor  # [N, P + T] 1 = real token
    prompt_len: int  # P
    completion_ids: Tensor  # [N, T]
    mask: Tensor  # [N, T] float, 1 = completion token (generated or tool output)
    loss_mask: Tensor  # [N, T] float, 1 = generated token (in the loss)
    rewards: Tensor  # [B, G]
    correct: Tensor  # [B, G] bool
    problems: list  # B Problem
    texts: list[str]  # N completions
    n_tool_calls: list[int]  # N
    rollout_logprobs: Tensor  # [N, T] log-prob under the sampler's distribution (NaN where none)


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


class _SampledLogprobs(LogitsProcessor):
    """Last in the processor list: sees the scores the sampler draws from (after temperature and top-p) and
    keeps, per row, log softmax(scores) of the token drawn from them, which is known at the next call (the
    last token's at `finish`). Holds one [n, V] tensor at a time."""

    def __init__(self):
        self.prev: Tensor | None = None  # [n, V] log-probs of the last call
        self.picked: list[Tensor] = []  # per generated token: [n]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._take(input_ids[:, -1])
        self.prev = scores.float().log_softmax(-1)  # [n, V]
        return scores

    def _take(self, tokens: Tensor) -> None:
        if self.prev is not None:
            self.picked.append(self.prev.gather(1, tokens[:, None])[:, 0])  # [n]
            self.prev = None

    def finish(self, new_tokens: Tensor) -> list[list[float]]:
        """[n, n_new] generated ids -> per row the sampler's log-prob of each."""
        if new_tokens.shape[1]:
            self._take(new_tokens[:, -1])
        if not self.picked:
            return [[] for _ in range(new_tokens.shape[0])]
        return torch.stack(self.picked, 1).cpu().tolist()  # [n, n_new]


def _sampler(sampling: dict) -> tuple[dict, _SampledLogprobs | None, list]:
    """generate() keywords and our processors: temperature and top-p move from generate's own warpers into
    the processor list, in generate's order (temperature, then top-p), so the recorder after them sees the
    exact distribution sampled from."""
    if not sampling.get("do_sample"):
        return sampling, None, []
    t, p = sampling.get("temperature") or 1.0, sampling.get("top_p") or 1.0
    procs = [TemperatureLogitsWarper(t)] if t != 1.0 else []
    procs += [TopPLogitsWarper(p)] if p < 1.0 else []
    record = _SampledLogprobs()
    return {**sampling, "temperature": 1.0, "top_p": 1.0, "top_k": 0}, record, [*procs, record]


class _StopOnText(StoppingCriteria):
    """Per-row stop once the new text contains `stop`; remembers how many new tokens each row had then."""

    def __init__(self, tokenizer, stop: str, start: int):
        self.tok, self.stop, self.start = tokenizer, stop, start
        self.window = len(stop.encode("utf-8")) + 2  # every token decodes to >= 1 byte
        self.stop_at: dict[int, int] = {}

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> Tensor:
        n_new = input_ids.shape[1] - self.start
        tail = input_ids[:, max(self.start, input_ids.shape[1] - self.window) :].tolist()
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
def _generate_turn(
    model, tokenizer, contexts: list[list[int]], *, max_new_tokens: int, sampling: dict, stop: str | None
) -> list[tuple[list[int], bool, list[float]]]:
    """One generation turn for every context: (new token ids, stopped at `stop`, the sampler's log-prob of
    each new token, NaN when greedy) per row."""
    pad, eos = tokenizer.pad_token_id, eos_ids(model, tokenizer)
    pad = eos[0] if pad is None else pad
    L = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), L), pad, dtype=torch.long)  # [n, L] left-padded
    attn = torch.zeros_like(ids)
    for i, c in enumerate(contexts):
        ids[i, L - len(c) :] = torch.tensor(c)
        attn[i, L - len(c) :] = 1
    dev = model.device
    criteria = _StopOnText(tokenizer, stop, L) if stop else None
    kwargs, record, procs = _sampler(sampling)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos, use_cache=True, **kwargs
    )
    ids, attn = ids.to(dev), attn.to(dev)
    with _only_our_generation_config(model):
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([criteria]) if criteria else None,
            logits_processor=LogitsProcessorList(procs) if procs else None,
            **prompt_sharing.shared_prefill(model, ids, attn),
        )
    lps = record.finish(out[:, L:]) if record else [[float("nan")] * (out.shape[1] - L)] * len(contexts)
    rows = []
    for i, new in enumerate(out[:, L:].tolist()):
        end = next((k + 1 for k, t in enumerate(new) if t in eos), len(new))  # keep the EOS: it is learned
        stop_at = criteria.stop_at.get(i) if criteria else None
        hit = stop_at is not None and stop_at <= end
        n = stop_at if hit else end
        rows.append((new[:n], hit, lps[i][:n]))
    return rows


@dataclass(frozen=True)
class _CompletionRows:
    """The completions while they grow, one row per sample: tokens, loss mask, the sampler's log-probs and
    the tool calls answered so far."""

    ids: list[list[int]]
    loss_mask: list[list[int]]
    logprobs: list[list[float]]
    calls: list[int]

    @classmethod
    def empty(cls, n: int) -> _CompletionRows:
        return cls([[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)], [0] * n)

    def add(self, i: int, ids: list[int], *, logprobs: list[float] | None = None) -> None:
        """Append tokens to row i: generated ones (with their log-probs) are in the loss; tool output
        (logprobs None) is not, and has no sampler log-prob (NaN)."""
        generated = logprobs is not None
        self.ids[i] += ids
        self.loss_mask[i] += [int(generated)] * len(ids)
        self.logprobs[i] += logprobs if generated else [float("nan")] * len(ids)

    def completions(self, prompt_ids: list[list[int]], tokenizer) -> Completions:
        return Completions(
            prompt_ids=prompt_ids,
            completion_ids=self.ids,
            loss_mask=self.loss_mask,
            texts=[tokenizer.decode(c, skip_special_tokens=True) for c in self.ids],
            n_tool_calls=self.calls,
            rollout_logprobs=self.logprobs,
        )


def _tool_limits(task: Task | None, max_turns: int) -> tuple[str | None, int]:
    """(the task's tool stop string or None, the most tool calls per completion: the task's
    `max_tool_calls`, else max_turns)."""
    stop = getattr(task, "tool_stop", None) if task is not None else None
    max_calls = getattr(task, "max_tool_calls", None)
    return stop, max_calls if max_calls is not None else max_turns


def _answer_tool(task: Task, tokenizer, rows: _CompletionRows, i: int) -> bool:
    """Append the tool's reply to row i's text so far (loss_mask 0, one call more); False when the tool
    replied None, which ends the completion."""
    reply = task.tool(tokenizer.decode(rows.ids[i], skip_special_tokens=True))
    if reply is None:
        return False
    rows.add(i, tokenizer(reply, add_special_tokens=False).input_ids)
    rows.calls[i] += 1
    return True


def generate_completions(
    model,
    tokenizer,
    prompts: list[str],
    *,
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
    rows = _CompletionRows.empty(len(prompt_ids))
    stop, max_calls = _tool_limits(task, max_turns)
    active = list(range(len(prompt_ids)))
    for turn in range(max_turns):
        if not active:
            break
        new = _generate_turn(
            model,
            tokenizer,
            [prompt_ids[i] + rows.ids[i] for i in active],
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=stop,
        )
        still = []
        for i, (ids, hit_stop, lps) in zip(active, new):
            rows.add(i, ids, logprobs=lps)
            more = hit_stop and turn < max_turns - 1 and rows.calls[i] < max_calls
            if more and _answer_tool(task, tokenizer, rows, i):
                still.append(i)
        active = still
    return rows.completions(prompt_ids, tokenizer)


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


def _reward(value) -> float:
    """A task's reward as a float; None (the task could not score it) stays NaN, never a number: the
    recorded sample keeps it and the advantage of an unscored completion is 0 (sampling.scored)."""
    return float("nan") if value is None else float(value)


def score_completions(comps: Completions, task: Task, problems: list[Problem]) -> tuple[Tensor, Tensor]:
    """(rewards [B, G], correct [B, G] bool): the task's verifiable reward of every completion."""
    G = len(comps.texts) // len(problems)
    texts = [[comps.texts[b * G + g] for g in range(G)] for b in range(len(problems))]
    rewards = torch.tensor([[_reward(task.reward(pr, t)) for t in ts] for pr, ts in zip(problems, texts)])
    correct = torch.tensor([[bool(task.is_correct(pr, t)) for t in ts] for pr, ts in zip(problems, texts)])
    return rewards, correct


def make_generation_batch(
    comps: Completions,
    task: Task,
    problems: list[Problem],
    tokenizer,
    scores: tuple[Tensor, Tensor] | None = None,
) -> GenerationBatch:
    """Score every completion with the task's verifiable reward (or take `scores` = (rewards, correct), each
    [B, G], already computed) and pack the batch."""
    rewards, correct = scores if scores is not None else score_completions(comps, task, problems)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    packed = pack(comps.prompt_ids, comps.completion_ids, comps.loss_mask, pad)
    T = packed[3].shape[1]
    sampled = torch.full((len(comps.texts), T), float("nan"))  # [N, T]
    for i, lps in enumerate(comps.rollout_logprobs):
        sampled[i, : len(lps)] = torch.tensor(lps, dtype=torch.float)
    input_ids, attention_mask, prompt_len, completion_ids, mask, loss_mask = packed
    return GenerationBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_len=prompt_len,
        completion_ids=completion_ids,
        mask=mask,
        loss_mask=loss_mask,
        rewards=rewards,
        correct=correct,
        problems=list(problems),
        texts=comps.texts,
        n_tool_calls=comps.n_tool_calls,
        rollout_logprobs=sampled,
    )


def evaluate(
    model,
    tokenizer,
    task: Task,
    *,
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
            n_samples=1,
            max_new_tokens=max_new_tokens,
            sampling=sampling_kwargs(0.0, 1.0),
            task=task,
            max_turns=max_turns,
        )
        for pr, text in zip(chunk, comps.texts):
            hits[str(pr.difficulty)].append(bool(task.is_correct(pr, text)))
    return {d: (sum(v) / len(v), len(v)) for d, v in sorted(hits.items())}
