"""The columns of every table of the run format: name, Arrow type, meaning (unit and source where it has
one). Part of tokengrad.schema, which re-exports the tables and versions them (SCHEMA_VERSION)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True, kw_only=True)
class Column:
    name: str
    type: pa.DataType
    doc: str
    nullable: bool = True


def _c(name: str, typ: pa.DataType, doc: str, nullable: bool = True) -> Column:
    return Column(name=name, type=typ, doc=doc, nullable=nullable)


_KEY = [
    _c("step", pa.int32(), "training step (one rollout batch; may hold several optimizer updates)", False),
    _c("rank", pa.int16(), "process rank that recorded the row", False),
]
_UPDATE = _c(
    "update_id", pa.int16(), "optimizer update within the step (num_iterations > 1, Lopti phases)", False
)

TOKENS = [
    *_KEY,
    _UPDATE,
    _c("pass_id", pa.int16(), "backward pass within the step (micro-batch, update pass, Lopti phase)", False),
    _c("sample_id", pa.int64(), "completion id, unique within the step", False),
    _c("group_id", pa.int64(), "prompt group the completion belongs to", False),
    _c("position", pa.int32(), "token index within the completion", False),
    _c("token_id", pa.int32(), "vocabulary id", False),
    _c("token", pa.string(), "decoded text of the token (empty without a tokenizer)"),
    _c("in_loss", pa.bool_(), "token is in the loss mask (False for e.g. tool output tokens)", False),
    _c("logprob", pa.float32(), "log pi_theta(token) that the loss is built from"),
    _c("old_logprob", pa.float32(), "log pi_old(token) of the rollout policy"),
    _c("ref_logprob", pa.float32(), "log pi_ref(token) of the reference policy, if any"),
    _c(
        "rollout_logprob",
        pa.float32(),
        "log-prob of the token under the distribution the sampler drew from (after top-p/top-k, from the "
        "generation-time logits, e.g. bf16); null for tool output and greedy decoding",
    ),
    _c(
        "policy_version",
        pa.int64(),
        "version of the weights that sampled the token's sequence, in the host's unit (built-in trainer: "
        "optimizer updates applied before sampling; verl: min_global_steps, its weight syncs); null: "
        "the host does not expose it",
    ),
    _c(
        "trainer_version",
        pa.int64(),
        "version of the weights whose log pi the row's loss pass computed (`logprob`), in the unit of "
        "policy_version; trainer_version - policy_version is the row's staleness in versions",
    ),
    _c(
        "is_weight",
        pa.float32(),
        "importance-sampling weight the host's loss multiplied the token's term by, read from the host's own "
        "tensor (TRL importance_sampling_ratio): exp(log pi_old - log mu) per token, "
        "or exp of the sum over the sequence, truncated or masked to 0; null without a correction",
    ),
    _c("masked", pa.bool_(), "the host removed the token's gradient by a mask (reason in masked_by)"),
    _c("masked_by", pa.string(), "which masks removed it (schema.MASK_REASONS joined by '+'); null: kept"),
    _c("prob", pa.float32(), "probability of the token at the sampling temperature: softmax(logits / T)"),
    _c("entropy", pa.float32(), "entropy of the next-token distribution, nats"),
    _c("sum_p2", pa.float32(), "sum_j p_j^2 (collision probability)"),
    _c(
        "logit_grad_unit",
        pa.float32(),
        "sqrt(1 - 2 prob + sum_p2) = norm of d(-log p)/dlogits (arXiv 2505.12929 Prop 4.2)",
    ),
    _c("advantage", pa.float32(), "advantage used for the token"),
    _c("weight", pa.float32(), "token weight of the weighting rule (1 = unweighted)"),
    _c("coef", pa.float32(), "dL/dlog pi for the token, exact (autograd hook)"),
    _c("ratio", pa.float32(), "exp(logprob - old_logprob)"),
    _c("clipped", pa.bool_(), "the PPO clip removed the token's policy gradient"),
    _c(
        "logit_grad_norm",
        pa.float32(),
        "abs(coef) * logit_grad_unit: exact norm of the token's gradient at its logits",
    ),
    _c(
        "head_grad_norm",
        pa.float32(),
        "logit_grad_norm * norm(h_t): norm of the token's gradient on the output projection (LM head) "
        "through the head path only; with a tied head (embedding = head, e.g. SmolLM2) that parameter also "
        "gets the input-embedding gradient, which this column does not include",
    ),
    _c(
        "update_share",
        pa.float32(),
        "coef <grad log pi, g> / norm(g)^2: the token's share of its update's gradient g; shares of all "
        "tokens and ranks plus the residual sum to 1 (attribution steps only)",
    ),
    _c(
        "dlogprob_pred",
        pa.float32(),
        "<grad log pi, delta>: first-order change of log pi predicted from the applied update delta "
        "(attribution steps only)",
    ),
    _c(
        "dlogprob", pa.float32(), "measured change of log pi over the applied update (attribution steps only)"
    ),
    _c(
        "entropy_share",
        pa.float32(),
        "coef <grad log pi, grad H> / <grad H, g>: the token's share of the first-order change of its update "
        "batch's mean token entropy H along the gradient g; shares of all tokens and ranks plus "
        "steps.entropy_share_residual sum to 1 (attribution steps with Attribution(entropy=True))",
    ),
    _c(
        "dentropy_pred",
        pa.float32(),
        "<grad H_t, delta>: first-order change of this position's entropy (nats) predicted from the applied "
        "update delta (entropy attribution steps)",
    ),
    _c(
        "dentropy",
        pa.float32(),
        "measured change of this position's entropy (nats) over the applied update (entropy attribution "
        "steps)",
    ),
    _c(
        "selected_by",
        pa.string(),
        "why a budgeted step kept the row: all, sequence, top_update_share, top_grad_norm, top_abs_coef "
        "(null: no token budget)",
    ),
]

REPLAY_K = (1, 5, 20)  # a spike's replay removes its top-k culprit tokens for each k (steps columns)

STEPS = [
    *_KEY,
    _c("loss", pa.float64(), "training loss (mean over the step's passes)"),
    _c("grad_norm", pa.float64(), "total gradient norm before clipping (max over the step's updates)"),
    _c(
        "spike_z",
        pa.float64(),
        "Attribution(on_spike=True) steps: modified z-score 0.6745 (x - median) / MAD of the spiking "
        "update's pre-clip norm against the steps before it (Iglewicz & Hoaglin 1993; > 3.5 started the "
        "attribution)",
    ),
    *(
        _c(
            f"grad_norm_without_top{k}",
            pa.float64(),
            f"on-spike steps: |g - sum_t coef_t grad log pi_t| over the {k} loss tokens of largest "
            "|update_share| (the spiking update's pre-clip norm without their loss terms, the other tokens' "
            "coef held; record/attribution/spike_replay.py)",
        )
        for k in REPLAY_K
    ),
    _c("n_updates", pa.int16(), "optimizer updates in the step"),
    _c("reward_mean", pa.float64(), "mean reward of the step's completions"),
    _c("reward_std", pa.float64(), "std of the step's rewards"),
    _c(
        "rollout_mismatch",
        pa.float64(),
        "mean |log pi_old - rollout_logprob| over the step's loss tokens: the training/inference mismatch "
        "(top-p truncation, bf16 generation; about 1e-7 when the sampler is the trained fp32 distribution)",
    ),
    _c(
        "rollout_mismatch_max",
        pa.float64(),
        "max |d| over the step's loss tokens the engine scored (d = log pi_old - rollout_logprob)",
    ),
    _c(
        "rollout_mismatch_p99",
        pa.float64(),
        "99th percentile of |d| over the loss tokens the engine scored (d = log pi_old - rollout_logprob)",
    ),
    _c("rollout_kl_k1", pa.float64(), "mean(-d): k1 estimate of KL(mu || pi_old) (verl rollout_corr/kl)"),
    _c("rollout_kl_k3", pa.float64(), "mean(exp(d) - d - 1): k3 estimate of KL(mu || pi_old) (verl k3_kl)"),
    _c("rollout_chi2_token", pa.float64(), "mean(exp(d)^2) - 1, |d| capped at 20 (verl chi2_token)"),
    _c("rollout_chi2_seq", pa.float64(), "mean over sequences of exp(2 sum_t d) - 1, capped (verl chi2_seq)"),
    _c("n_rollout_nan", pa.int64(), "loss tokens the engine returned no log-prob for (NaN; left out above)"),
    _c(
        "is_weight_min", pa.float64(), "min applied IS weight (over sequences in sequence modes, as TRL logs)"
    ),
    _c(
        "is_weight_mean", pa.float64(), "mean applied IS weight (TRL sampling/importance_sampling_ratio/mean)"
    ),
    _c("is_weight_max", pa.float64(), "max applied IS weight"),
    _c("is_ess", pa.float64(), "(sum w)^2 / (n sum w^2) over loss tokens: verl's rollout_is_eff_sample_size"),
    _c("is_masked_tokens", pa.int64(), "loss tokens the IS mask set to weight 0"),
    _c("is_masked_sequences", pa.int64(), "sequences the IS mask removed whole"),
    _c(
        "rs_masked_tokens",
        pa.int64(),
        "loss tokens verl's rejection sampling (rollout_rs) removed; / loss tokens = verl "
        "rollout_corr/rollout_rs_masked_fraction",
    ),
    _c(
        "rs_masked_sequences",
        pa.int64(),
        "sequences with a token verl's rejection sampling removed; / sequences = verl "
        "rollout_corr/rollout_rs_seq_masked_fraction",
    ),
    _c("groups_generated", pa.int64(), "prompt groups generated in the step (dynamic sampling refills)"),
    _c("groups_kept", pa.int64(), "prompt groups in the update batch (informative, up to prompts_per_step)"),
    _c("gen_rounds", pa.int16(), "generation rounds of prompts_per_step prompts (max_gen_batches)"),
    _c("entropy_mean", pa.float64(), "mean token entropy (loss tokens)"),
    _c(
        "dentropy_mean_pred",
        pa.float64(),
        "predicted change of the mean token entropy H (nats) along the applied update: mean of dentropy_pred "
        "over the loss tokens of the step's attributed updates (one update: exactly that update's dH)",
    ),
    _c("dentropy_mean", pa.float64(), "measured change of the mean token entropy H over the applied update"),
    _c(
        "entropy_grad_dot",
        pa.float64(),
        "<grad H, g> (nats per unit step): -lr times it is plain gradient descent's first-order dH; "
        "entropy_share times it is a token's part (mean over updates weighted by loss tokens)",
    ),
    _c(
        "entropy_share_residual",
        pa.float64(),
        "1 - sum of entropy_share over an update's tokens (terms not built on log pi; mean over updates)",
    ),
    _c(
        "cov_logprob_adv",
        pa.float64(),
        "Cov(log pi, A) over the update batch's loss tokens, the term CW-GRPO (arXiv 2605.11538) and "
        "Clip-Cov / KL-Cov (arXiv 2505.22617) act on; natural PG moves H by about -lr Cov (entropy "
        "attribution steps)",
    ),
    _c("kl", pa.float64(), "mean KL to the reference policy"),
    _c("clip_frac", pa.float64(), "share of loss tokens whose gradient the clip removed"),
    _c("weight_mean", pa.float64(), "mean token weight"),
    _c("weight_min", pa.float64(), "min token weight"),
    _c("weight_max", pa.float64(), "max token weight"),
    _c("lr", pa.float64(), "learning rate"),
    _c("ds_grad_norm", pa.float64(), "DeepSpeed's own global gradient norm (engine.get_global_grad_norm)"),
    _c(
        "loss_scale",
        pa.float64(),
        "the fp16 gradient scaler's scale the step's backward used (null: no scaler); an update whose "
        "gradient overflowed at it is skipped by the scaler, which then lowers the scale",
    ),
    _c("n_tokens", pa.int64(), "loss tokens recorded in the step"),
    _c("n_nonfinite", pa.int64(), "NaN/inf values met in the recorded token tensors"),
    _c("n_token_rows", pa.int64(), "token rows written for the step (fewer than recorded under a budget)"),
    _c("time_step", pa.float64(), "wall seconds of the step"),
    _c("time_record", pa.float64(), "seconds the training thread spent in the recorder"),
]

LAYERS = [
    *_KEY,
    _UPDATE,
    _c("layer", pa.string(), "top-level block name (named_modules dotted name) or 'total'", False),
    _c("grad_norm", pa.float64(), "gradient norm of the block's parameters before clipping"),
]

BUCKETS = [
    *_KEY,
    _UPDATE,
    _c("bucket", pa.string(), "label '[lo,hi)' or 'residual'", False),
    _c("lo", pa.float32(), "lower probability edge (inclusive)"),
    _c("hi", pa.float32(), "upper probability edge (exclusive; 1 is inclusive)"),
    _c("n_tokens", pa.int64(), "loss tokens in the bucket"),
    _c("token_share", pa.float64(), "n_tokens / all loss tokens"),
    _c("grad_norm", pa.float64(), "norm of the bucket's gradient g_B over all parameters"),
    _c("update_share", pa.float64(), "<g_B, g> / norm(g)^2; sums to 1 over buckets and residual"),
    _c("cos_to_total", pa.float64(), "cosine(g_B, g)"),
    _c(
        "dprob_mean",
        pa.float64(),
        "mean change of probability over the step's updates (pi_old to the final policy) of the step's loss "
        "tokens with A != 0, bucketed by pi_old (AR-Lopti); on the rows of the step's last update",
    ),
    _c(
        "correct_ratio",
        pa.float64(),
        "share of A > 0 tokens whose log-prob rose over the step (tokens at p = 1 left out; by pi_old)",
    ),
]

SAMPLES = [
    *_KEY,
    _c("sample_id", pa.int64(), "completion id, as in tokens", False),
    _c("group_id", pa.int64(), "prompt group", False),
    _c("prompt", pa.string(), "prompt text"),
    _c("completion", pa.string(), "completion text"),
    _c("reward", pa.float64(), "scalar reward"),
    _c("advantage", pa.float64(), "sequence advantage"),
    _c("length", pa.int32(), "completion length in tokens"),
    _c(
        "rollout_seq_log_ratio",
        pa.float64(),
        "sum_t (log pi_old - log mu) over the loss tokens: the log of the sequence IS ratio as TRL 1.16 "
        "computes it (the sum, not the mean: TRL #4772, PR #5815)",
    ),
    _c(
        "rollout_gap_mean", pa.float64(), "mean per-token gap log pi_old - log mu over the scored loss tokens"
    ),
    _c("task", pa.string(), "task name"),
    _c("difficulty", pa.string(), "task difficulty label"),
]

EVALS = [
    *_KEY,
    _c("task", pa.string(), "task name", False),
    _c("difficulty", pa.string(), "difficulty label (e.g. K&K number of people)", False),
    _c("accuracy", pa.float64(), "share of eval problems solved"),
    _c("n", pa.int64(), "problems evaluated"),
]

_SUM = "summed over the loss tokens of all of the step's passes of the update, before any sampling"
PROB_BINS = [
    *_KEY,
    _UPDATE,
    _c("lo", pa.float32(), "lower probability edge of the bin (inclusive)", False),
    _c("hi", pa.float32(), "upper probability edge (exclusive; 1 is inclusive)", False),
    _c("adv_sign", pa.int8(), "sign of the advantage: -1, 0, 1", False),
    _c("n_tokens", pa.int64(), "loss tokens in the bin, " + _SUM, False),
    _c("sum_prob", pa.float64(), "sum of prob (mean = sum / n_tokens)"),
    _c("sum_entropy", pa.float64(), "sum of entropy"),
    _c("sum_logit_grad_unit", pa.float64(), "sum of logit_grad_unit"),
    _c("sum_abs_coef", pa.float64(), "sum of abs(coef)"),
    _c("sum_logit_grad_norm", pa.float64(), "sum of logit_grad_norm"),
    _c("sum_head_grad_norm", pa.float64(), "sum of head_grad_norm"),
    _c("sum_update_share", pa.float64(), "sum of update_share (attribution steps)"),
    _c("sum_entropy_share", pa.float64(), "sum of entropy_share (entropy attribution steps)"),
]

VOCAB = [
    *_KEY,
    _c(
        "token_id",
        pa.int32(),
        "vocabulary id (one of the step's top tokens by count or by summed share)",
        False,
    ),
    _c("token", pa.string(), "decoded text of the token"),
    _c("adv_sign", pa.int8(), "sign of the advantage: -1, 0, 1", False),
    _c(
        "lo",
        pa.float32(),
        "lower edge of the token's probability bucket (the recorder's bucket edges)",
        False,
    ),
    _c("hi", pa.float32(), "upper edge of the bucket", False),
    _c("n_tokens", pa.int64(), "occurrences as a loss token, " + _SUM.replace(" of the update", ""), False),
    _c("sum_prob", pa.float64(), "sum of prob (mean prob = sum_prob / n_tokens)"),
    _c("sum_update_share", pa.float64(), "sum of update_share (attribution steps)"),
    _c("sum_logit_grad_norm", pa.float64(), "sum of logit_grad_norm"),
]

WHATIF = [
    *_KEY,
    _UPDATE,
    _c(
        "rule",
        pa.string(),
        "weighting rule evaluated on the update's passes: its name, or name:key=value,... with parameters",
        False,
    ),
    _c("phase", pa.int8(), "the rule's update phase (Lopti: 0 and 1, both at the same parameters)", False),
    _c(
        "bucket",
        pa.string(),
        "'all' (the whole counterfactual update g_R) or a probability bucket '[lo,hi)'",
        False,
    ),
    _c("lo", pa.float32(), "lower probability edge (inclusive); null on 'all'"),
    _c("hi", pa.float32(), "upper probability edge (exclusive; 1 is inclusive); null on 'all'"),
    _c("n_tokens", pa.int64(), "loss tokens in the bucket (all of the update's on 'all')"),
    _c("grad_norm", pa.float64(), "norm of g_R ('all', before any clipping) or of its bucket part g_R,B"),
    _c(
        "update_share",
        pa.float64(),
        "bucket rows: <g_R,B, g_R> / norm(g_R)^2, summing to 1; 'all': <g_R, g> / norm(g)^2, against the "
        "actual update g",
    ),
    _c("cos_to_actual", pa.float64(), "cosine(g_R, g) ('all') or cosine(g_R,B, g) to the actual update g"),
    _c("would_clip", pa.bool_(), "'all': norm(g_R) exceeds the host's max_grad_norm (null: no clip known)"),
]

TABLES: dict[str, list[Column]] = {
    "tokens": TOKENS,
    "steps": STEPS,
    "layers": LAYERS,
    "buckets": BUCKETS,
    "samples": SAMPLES,
    "evals": EVALS,
    "prob_bins": PROB_BINS,
    "vocab": VOCAB,
    "whatif": WHATIF,
}
# Tables that accept extra caller-defined columns (float/int/str), merged by name when read.
EXTENSIBLE = frozenset({"tokens", "steps", "samples"})
