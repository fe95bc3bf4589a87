"""A token's share of its step's gradient, defined once: the token inspector's tables (tokengrad.read.queries
top_tokens, top_samples) and the doctor's culprit tokens (tokengrad.doctor.culprits) both read it here.

    token_shares(run, 97)                        # the step's combined update, one row per loss token
    token_shares(run, 97, update_id=0)           # one update of the step (a Lopti phase, a PPO pass)
    step_updates(run, 97)                        # [update_id, n_loss]: the updates with token rows

A step can hold several optimizer updates u (Lopti's two phases, mu > 1 passes, mini-batches), each with
its own gradient g_u. The share of a loss token t, by a per-token `value` v:

- of one update u: v_{t,u} / sum of v over the update's loss tokens; by update_share, the recorded
  s_{t,u} = <g_{t,u}, g_u> / |g_u|^2 itself (exact: the shares of all tokens and the residual sum to 1);
- of the step (update_id=None): the token's v summed over the updates that had it in their loss, over the
  same sum for every loss token of the step (with Lopti a token counts in the phase that trained it); by
  update_share, the headline's pooling (tokengrad.read.headline): sum_u s_{t,u} |g_u|^2 / sum_u |g_u|^2
  over the step's attributed updates, |g_u| the layers table's pre-clip total of u (every update weighs
  the same where one of them has no recorded norm).

A token is (sample_id, position); its other columns come from its row in the loss of the earliest update
(`picked_rows_sql`), so a Lopti token shows the phase that trained it.
"""

from __future__ import annotations

import pandas as pd

from tokengrad.schema import LAYER, TOK, TOTAL_LAYER, column_names

STEP_LEVEL = None  # update_id meaning "every update of the step, combined"


def _value(name: str) -> str:
    if name not in column_names("tokens"):
        raise ValueError(f"{name!r} is not a tokens column; columns: {sorted(column_names('tokens'))}")
    return name


def _rows(step: int, update_id: int | None) -> tuple[str, list]:
    """`WHERE` selecting the step's rows (of one update, or of all)."""
    if update_id is None:
        return f"WHERE {TOK.step} = ?", [int(step)]
    return f"WHERE {TOK.step} = ? AND {TOK.update_id} = ?", [int(step), int(update_id)]


def picked_rows_sql(step: int, update_id: int | None) -> tuple[str, list]:
    """One row per token of the step: its row in the loss of the earliest update that trained it, else its
    earliest row (a token outside every loss)."""
    where, params = _rows(step, update_id)
    return (
        f"SELECT * FROM tokens {where} QUALIFY row_number() OVER (PARTITION BY {TOK.sample_id}, "
        f"{TOK.position} ORDER BY {TOK.in_loss} DESC, {TOK.update_id}, {TOK.pass_id}) = 1",
        params,
    )


def update_weights(run, step: int) -> dict[int, float]:
    """{update_id: |g_u|^2} of the step from the layers table's pre-clip totals (max over ranks)."""
    df = run.sql(
        f"SELECT {LAYER.update_id} AS u, max({LAYER.grad_norm}) AS g FROM layers WHERE {LAYER.step} = ? "
        f"AND {LAYER.layer} = ? GROUP BY u",
        [int(step), TOTAL_LAYER],
    )
    return {int(u): float(g) ** 2 for u, g in zip(df["u"], df["g"]) if pd.notna(g)}


def shares_sql(run, step: int, value: str, update_id: int | None) -> tuple[str, list]:
    """SELECT of [sample_id, position, <value>, share, updates] over the step's loss tokens (module doc);
    `updates` names the updates whose loss held the token ("0", "0, 1")."""
    v = _value(value)
    where, params = _rows(step, update_id)
    rows = f"SELECT {TOK.sample_id}, {TOK.position}, {TOK.update_id}, {v} AS v FROM tokens {where} " + (
        f"AND {TOK.in_loss} AND {v} IS NOT NULL"
    )
    updates = f"array_to_string(list_sort(list(DISTINCT {TOK.update_id})), ', ')"
    keys = f"{TOK.sample_id}, {TOK.position}"
    if v != TOK.update_share:
        sql = (
            f"SELECT {keys}, sum(v) AS {v}, sum(v) / nullif(sum(sum(v)) OVER (), 0) AS share, "
            f"{updates} AS updates FROM ({rows}) GROUP BY {keys}"
        )
        return sql, params
    if update_id is not None:
        own = f"SELECT {keys}, sum(v) AS {v}, sum(v) AS share, {updates} AS updates FROM ({rows})"
        return f"{own} GROUP BY {keys}", params
    got = run.sql(f"SELECT DISTINCT {TOK.update_id} AS u FROM ({rows})", params)
    attributed = [int(u) for u in got["u"]]
    norms = update_weights(run, step)
    if not all(norms.get(u, 0.0) > 0 for u in attributed):
        norms = dict.fromkeys(attributed, 1.0)
    total = sum(norms[u] for u in attributed) or 1.0
    weight = f"(SELECT unnest(?::INTEGER[]) AS {TOK.update_id}, unnest(?::DOUBLE[]) AS w)"
    sql = (
        f"SELECT {keys}, sum(v * w) AS {v}, sum(v * w) AS share, {updates} AS updates "
        f"FROM ({rows}) JOIN {weight} USING ({TOK.update_id}) GROUP BY {keys}"
    )
    return sql, params + [attributed, [norms[u] / total for u in attributed]]


def token_shares(
    run,
    step: int,
    *,
    value: str = TOK.logit_grad_norm,
    update_id: int | None = STEP_LEVEL,
    k: int | None = None,
) -> pd.DataFrame:
    """[sample_id, position, token_id, token, prob, <value>, share, updates] of the step's loss tokens,
    largest |share| first (at most k). update_id None: the step's combined update (module doc)."""
    sql, params = shares_sql(run, step, value, update_id)
    picked, pp = picked_rows_sql(step, update_id)
    v = _value(value)
    q = (
        f"SELECT p.{TOK.sample_id}, p.{TOK.position}, p.{TOK.token_id}, p.{TOK.token}, p.{TOK.prob}, "
        f"s.{v}, s.share, s.updates FROM ({sql}) s JOIN ({picked}) p USING ({TOK.sample_id}, {TOK.position}) "
        f"ORDER BY abs(s.share) DESC NULLS LAST, s.{v} DESC, p.{TOK.sample_id}, p.{TOK.position}"
        + (" LIMIT ?" if k is not None else "")
    )
    return run.sql(q, params + pp + ([int(k)] if k is not None else []))


def step_updates(run, step: int) -> pd.DataFrame:
    """[update_id, n_tokens, n_loss] of the step: its updates with token rows and their loss tokens."""
    return run.sql(
        f"SELECT {TOK.update_id}, count(*) AS n_tokens, count(*) FILTER (WHERE {TOK.in_loss}) AS n_loss "
        f"FROM tokens WHERE {TOK.step} = ? GROUP BY {TOK.update_id} ORDER BY {TOK.update_id}",
        [int(step)],
    )
