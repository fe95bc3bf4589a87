"""Token inspector: one completion coloured token by token, and spike forensics for one step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common
from tokengrad.figures.gradnorms import run_grad_norms
from tokengrad.figures.liveness import live_mask
from tokengrad.figures.smoothing import find_spikes
from tokengrad.figures.tokens import GAP, PUSH, make_token_figure, token_html, with_gap, with_push
from tokengrad.read.display import visible_lines
from tokengrad.read.queries import CONTEXT_MARKS
from tokengrad.read.token_text import readable_text
from tokengrad.schema import SAMPLE, STEP, TOK

COLOR_BY = (
    PUSH,  # -coef: the update's direction on the token (figures.tokens.PUSH)
    TOK.prob,
    TOK.weight,
    TOK.coef,
    TOK.logit_grad_norm,
    TOK.head_grad_norm,
    TOK.entropy,
    TOK.advantage,
    TOK.logprob,
    TOK.ratio,
    TOK.update_share,
    TOK.entropy_share,
    TOK.dentropy,
    GAP,  # log pi_old - log mu: where the rollout engine and the trainer disagree (figures.tokens.GAP)
    TOK.is_weight,
)
RANK_BY = (TOK.logit_grad_norm, TOK.head_grad_norm, TOK.logit_grad_unit)
# with per-token attribution recorded, a token's exact share of the update ranks first (arXiv 2505.12929's
# question answered exactly: its own gradient norm ignores how tokens' gradients cancel or align)
RANK_BY_ATTRIBUTED = (TOK.update_share, *RANK_BY)
STEP_KEY, STEP_RUN_KEY, PICKED_KEY = "in_step", "in_step_run", "in_picked_row"
COLOR_NAMES = {PUSH: "−coef: pushed up / pushed down", GAP: "rollout gap: log π_old − log μ"}


def _grad_norms(run: str) -> pd.DataFrame:
    """[step, grad_norm] of the whole model (layers total, else the steps table)."""
    return run_grad_norms(data.table(run, "layers"), data.table(run, "steps"))


def _spike_steps(gn: pd.DataFrame) -> list[int]:
    """Steps whose pre-clip gradient norm is a spike among the live steps."""
    if gn.empty:
        return []
    values = gn[STEP.grad_norm].to_numpy()
    live = np.flatnonzero(live_mask(values))
    return [int(s) for s in gn[STEP.step].to_numpy()[live[find_spikes(values[live])]]]


def _ranges(steps: list[int]) -> str:
    """'3-5, 7, 11' for [3, 4, 5, 7, 11]."""
    out: list[list[int]] = []
    for s in steps:
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def _largest_step(steps: list[int], per_step: pd.DataFrame, gn: pd.DataFrame) -> int:
    """The token step with the largest gradient norm (recorded norm, else the summed token norms)."""
    norms = gn.set_index(STEP.step)[STEP.grad_norm].reindex(steps) if not gn.empty else pd.Series(dtype=float)
    if norms.notna().any() and norms.max() > 0:
        return int(norms.idxmax())
    sums = per_step.set_index(TOK.step)["grad_sum"].reindex(steps)
    return int(sums.idxmax()) if sums.notna().any() and sums.max() > 0 else steps[-1]


def nearest(steps: list[int], value) -> int:
    """The token step nearest to `value` (a typed step may fall between recorded ones)."""
    return min(steps, key=lambda s: (abs(s - int(value)), s))


def _go(step: int) -> None:
    st.session_state[STEP_KEY] = int(step)


def _spike_buttons(cols, spikes: list[int], step: int, largest: int) -> None:
    prev = max((s for s in spikes if s < step), default=None)
    nxt = min((s for s in spikes if s > step), default=None)
    cols[0].button("◀ previous spike", on_click=_go, args=(prev,), disabled=prev is None, key="in_prev")
    cols[1].button("next spike ▶", on_click=_go, args=(nxt,), disabled=nxt is None, key="in_next")
    cols[2].button("Largest-gradient step", on_click=_go, args=(largest,), key="in_largest")


def _step_ui(run: str) -> tuple[int, bool, str]:
    """The inspected step, whether it had a gradient, and what it is (spike / largest-gradient step)."""
    steps = data.query(run, "token_steps")
    per_step = data.query(run, "step_gradients")
    live = {int(s) for s in per_step.loc[per_step["live"], TOK.step]}
    gn = _grad_norms(run)
    spikes = [s for s in _spike_steps(gn) if s in set(steps)]
    largest = _largest_step(steps, per_step, gn)
    if st.session_state.get(STEP_RUN_KEY) != run:  # first visit, or another run: its largest gradient
        linked = st.session_state.get(STEP_KEY) if STEP_RUN_KEY not in st.session_state else None
        st.session_state[STEP_RUN_KEY] = run  # a first visit from a link (urlstate "step") keeps its step
        st.session_state[STEP_KEY] = nearest(steps, linked) if linked is not None else largest
    elif st.session_state.get(STEP_KEY) not in steps:  # typed between recorded steps
        st.session_state[STEP_KEY] = nearest(steps, st.session_state.get(STEP_KEY, largest))
    c = st.columns([2, 1, 1, 1.3])
    c[0].number_input(
        "Step",
        min_value=steps[0],
        max_value=steps[-1],
        step=1,
        key=STEP_KEY,
        help="Type a step; one without token rows goes to the nearest recorded step.",
    )
    step = int(st.session_state[STEP_KEY])
    _spike_buttons(c[1:], spikes, step, largest)
    where = f"spikes at {_ranges(spikes)}" if spikes else "no gradient-norm spike among the live steps"
    st.caption(
        f"Steps with a gradient: {_ranges(sorted(live)) or 'none'} ({len(live)} of {len(steps)}); {where}; "
        f"largest gradient at step {largest}."
    )
    kind = "Gradient-norm spike" if step in spikes else "Largest-gradient step" if step == largest else "Step"
    return step, step in live, kind


DEAD_STEP = (
    "Step {step} had no gradient: every advantage was 0 (each group's completions got the same "
    "reward), so every token's coef and logit_grad_norm are 0 and there is nothing to rank. "
    "Pick a step marked ● on the slider."
)


def _open_picked(step: int, table: str, frame: pd.DataFrame, event) -> None:
    """A clicked row of a forensics table opens that completion below (once per new click)."""
    rows = list(getattr(getattr(event, "selection", None), "rows", None) or [])
    if not rows or rows[0] >= len(frame):
        return
    pick = (step, table, int(frame[TOK.sample_id].iloc[rows[0]]))
    if st.session_state.get(PICKED_KEY) != pick:
        st.session_state[PICKED_KEY] = pick
        st.session_state[f"in_sample_{step}"] = pick[2]


def _update_label(updates: pd.DataFrame, update_id: int | None) -> str:
    total = int(updates["n_loss"].sum())
    if update_id is None:
        return f"step: its {len(updates)} updates combined ({total} loss tokens)"
    n = int(updates.set_index(TOK.update_id).loc[update_id, "n_loss"])
    return f"update {update_id}: {n} of the step's {total} loss tokens"


def _update_ui(run: str, step: int) -> int | None:
    """The update whose shares the tables show (a Lopti phase, a PPO pass, a mini-batch), or None: the
    step's combined update, the share the doctor quotes (tokengrad.read.token_shares)."""
    updates = data.query(run, "step_updates", step=step)
    if len(updates) < 2:
        return None
    return st.radio(
        "Shares of",
        [None, *(int(u) for u in updates[TOK.update_id])],
        format_func=lambda u: _update_label(updates, u),
        horizontal=True,
        key=f"in_update_{step}",
        help="This step made several optimizer updates (Lopti phases, PPO passes, mini-batches), each "
        "with its own gradient. The step shows a token's share of all of them together, as the doctor's "
        "findings do; an update shows its share of that update alone.",
    )


def share_of(update_id: int | None) -> str:
    """The share column's label: what the share is a share of."""
    return "share of the step" if update_id is None else f"share of update {update_id}"


def _share_column(update_id: int | None) -> dict:
    label = share_of(update_id)
    return {"share": st.column_config.ProgressColumn(label, format="percent", min_value=0.0, max_value=1.0)}


def _forensics(run: str, step: int, update_id: int | None) -> None:
    ranks = RANK_BY_ATTRIBUTED if data.query(run, "attributed_steps") else RANK_BY
    value = st.radio("Rank by", ranks, horizontal=True, key="in_rank_by")
    c1, c2 = st.columns([2, 3])
    with c1:
        _top_samples(run, step, value, update_id)
    with c2:
        _top_tokens(run, step, value, update_id)


def _top_samples(run: str, step: int, value: str, update_id: int | None) -> None:
    """The step's 10 samples carrying most of its gradient; a clicked row opens that completion."""
    st.markdown(f"**Samples carrying most of the {_scope(update_id)}** (click a row to open it)")
    samples = data.query(run, "top_samples", step=step, k=10, value=value, update_id=update_id)
    event = st.dataframe(
        samples.assign(
            **{SAMPLE.completion: samples[SAMPLE.completion].map(visible_lines, na_action="ignore")}
        ),
        hide_index=True,
        width="stretch",
        key=f"in_top_samples_{step}_{update_id}",
        on_select="rerun",
        selection_mode="single-row",
        column_config=_share_column(update_id),
        column_order=[
            "sample_id",
            "share",
            SAMPLE.reward,
            "n_tokens",
            "prob_mean",
            TOK.advantage,
            f"{value}_sum",
            TOK.group_id,
            SAMPLE.completion,
        ],
    )
    _open_picked(step, "samples", samples, event)


def _scope(update_id: int | None) -> str:
    return "step's gradient" if update_id is None else f"gradient of update {update_id}"


def _top_tokens(run: str, step: int, value: str, update_id: int | None) -> None:
    """The step's 20 tokens carrying most of its gradient, with context; a click opens its completion."""
    st.markdown(f"**Tokens carrying most of the {_scope(update_id)}** (click a row to open its completion)")
    tokens = data.query(run, "top_tokens", step=step, k=20, value=value, update_id=update_id)
    event = st.dataframe(
        tokens.assign(context=tokens["context"].map(_context_text, na_action="ignore")),
        hide_index=True,
        width="stretch",
        key=f"in_top_tokens_{step}_{update_id}",
        on_select="rerun",
        selection_mode="single-row",
        column_config={
            **_share_column(update_id),
            "updates": st.column_config.TextColumn(
                "updates", help="The step's updates whose loss held the token (a Lopti token: one phase)."
            ),
            "context": st.column_config.TextColumn(
                "context (±5 tokens)", help="The token in ⟦ ⟧ with the 5 tokens before and after it."
            ),
            TOK.sample_id: st.column_config.NumberColumn("sample"),
        },
        column_order=[
            TOK.sample_id,
            TOK.position,
            "context",
            "share",
            "updates",
            TOK.prob,
            TOK.coef,
            TOK.weight,
            TOK.advantage,
            value,
            TOK.entropy,
            TOK.clipped,
            TOK.group_id,
        ],
    )
    _open_picked(step, "tokens", tokens, event)


def _context_text(context: str) -> str:
    """A character split over tokens drawn whole on the token completing it (a bracketed part reads ◌)."""
    return visible_lines(readable_text(context, CONTEXT_MARKS))


def _pct(x) -> str:
    return f"{x:.1%}" if pd.notna(x) else "no gradient"  # undefined share: the step's gradient is 0


def _num(x) -> str:
    return f"{x:.3g}" if pd.notna(x) else "not recorded"


def _completion(run: str, step: int, update_id: int | None) -> None:
    ranked = data.query(run, "top_samples", step=step, k=100_000, update_id=update_id)
    if ranked.empty:
        st.info(f"No token rows at step {step}.")
        return
    labels = {
        int(
            r.sample_id
        ): f"sample {int(r.sample_id)}: {_pct(r.share)} {share_of(update_id)}, reward {_num(r.reward)}"
        for r in ranked.itertuples()
    }
    wanted = st.session_state.pop("in_sample", None)  # from a finding's link (urlstate "sample")
    if wanted in labels:
        st.session_state[f"in_sample_{step}"] = wanted
    c1, c2 = st.columns([3, 2])
    sample = c1.selectbox(  # keyed by step: another step's completions never keep a stale label
        "Completion (ranked by gradient share)", list(labels), format_func=labels.get, key=f"in_sample_{step}"
    )
    color_by = c2.selectbox(
        "Colour tokens by",
        COLOR_BY,
        key="in_color",
        format_func=lambda c: COLOR_NAMES.get(c, c),
        help="−coef = −∂L/∂log π: blue tokens the update makes more likely, red ones less likely.",
    )
    tokens = with_gap(
        with_push(data.query(run, "sample_tokens", step=step, sample_id=sample, update_id=update_id))
    )
    if tokens.empty or color_by not in tokens or tokens[color_by].isna().all():
        st.info(f"'{color_by}' was not recorded for this completion; pick another colour.")
        return
    st.markdown(f"**Sample {sample}** · {labels[sample].split(': ', 1)[1]}")
    st.html(token_html(tokens, color_by))
    st.caption(
        "Each box is one token; hover it for every value recorded for it; faded tokens are outside the loss."
    )
    with st.expander("Prompt and completion text"):
        samples = data.table(run, "samples")
        row = samples[(samples[SAMPLE.step] == step) & (samples[SAMPLE.sample_id] == sample)]
        st.text(
            visible_lines(row[SAMPLE.prompt].iloc[0])
            if len(row)
            else "(no samples table row for this completion)"
        )
        st.text(visible_lines(row[SAMPLE.completion].iloc[0]) if len(row) else "")
    with st.expander("As a chart (for download)"):
        common.chart(
            make_token_figure(tokens, color_by, title=f"step {step}, sample {sample}: {color_by}"),
            "in_tokens",
            f"tokens_{common.run_name(run)}_s{step}_{sample}_{color_by}",
        )


def render() -> None:
    st.title("Token inspector")
    runs = common.require_runs()
    run = common.pick_token_run(runs, "in_run")
    if run is not None:
        with common.guard("Step"):
            step, live, kind = _step_ui(run)
            st.subheader(
                f"{kind} {step}: which tokens carry its gradient" if kind != "Step" else f"Step {step}"
            )
            update_id = _update_ui(run, step)
            with common.guard("Spike forensics"):
                if live:
                    _forensics(run, step, update_id)
                else:
                    st.info(DEAD_STEP.format(step=step), icon=":material/block:")
            st.subheader("Completion")
            with common.guard("Completion"):
                _completion(run, step, update_id)
    common.show_run_warnings(runs)


render()
