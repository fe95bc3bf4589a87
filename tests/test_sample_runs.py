"""The shipped sample runs (scripts/make_sample_runs.py): complete, schema-valid, comparable, small."""

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tokengrad import list_runs, load_run, schema

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RUNS = ROOT / "sample_runs"
RULES = ("grpo", "tr_grpo", "ar_lopti")
# run name -> (rule, model, minimum steps, minimum share of steps with a gradient): issue-level promises
RUNS = (
    {f"lab_{r}": (r, "lab-add", 200, 0.8) for r in RULES}
    | {f"lab_kk_{r}": (r, "lab-kk", 100, 0.8) for r in RULES}
    | {f"smollm_{r}": (r, "smollm2-135m-instruct", 8, 0.7) for r in RULES}
    | {f"lab_grpo_{extra}": ("grpo", "lab-add", 100, 0.8) for extra in ("rollout", "entropy", "whatif")}
)
# the run whose step 0 a run shares (same seed and config up to the rule): the rollout run samples with
# another engine (bf16, top-p), so it shares the prompts only; the entropy and what-if runs have their own
# seeds
SAME_STEP0 = {"lab_grpo_rollout": "lab_grpo"}
SAME_PROMPTS_ONLY = {"lab_grpo_rollout"}
OWN_SEED = {"lab_grpo_entropy", "lab_grpo_whatif"}
# the dashboard's pages (tokengrad/app/streamlit_app.py)
PAGES = ("overview", "buckets", "wordclouds", "inspector", "entropy", "rollout", "whatif", "evaluation")
# difficulty levels each family evaluates: carries 0-4, people 2-4, one-digit sums
LEVELS = {"lab_kk_": 3, "lab_": 5, "smollm_": 1}
SIZE_LIMIT = 30 * 2**20
# Columns added by later schema versions: a run recorded under an older version lacks them (and only them).
ADDED_IN = {
    2: {"update_share", "dlogprob_pred", "dlogprob", "selected_by", "n_token_rows"},
    3: {
        "rollout_logprob",
        "rollout_mismatch",
        "groups_generated",
        "groups_kept",
        "gen_rounds",
        "ds_grad_norm",
    },
    4: {
        "entropy_share",
        "dentropy_pred",
        "dentropy",
        "dentropy_mean_pred",
        "dentropy_mean",
        "entropy_grad_dot",
        "entropy_share_residual",
        "cov_logprob_adv",
        "sum_entropy_share",
        "is_ess",
        "is_masked_sequences",
        "is_masked_tokens",
        "is_weight",
        "is_weight_max",
        "is_weight_mean",
        "is_weight_min",
        "masked",
        "masked_by",
        "n_rollout_nan",
        "rollout_chi2_seq",
        "rollout_chi2_token",
        "rollout_gap_mean",
        "rollout_kl_k1",
        "rollout_kl_k3",
        "rollout_mismatch_max",
        "rollout_mismatch_p99",
        "rollout_seq_log_ratio",
    },
    5: {
        "rs_masked_tokens",
        "rs_masked_sequences",
        "spike_z",
        "grad_norm_without_top1",
        "grad_norm_without_top5",
        "grad_norm_without_top20",
    },
    6: {"policy_version", "trainer_version"},
    7: {"loss_scale"},
}
TABLES_ADDED_IN = {"prob_bins": 2, "vocab": 2, "whatif": 8}  # tables an older run has no files of


@pytest.fixture(scope="module")
def runs():
    paths = list_runs(SAMPLE_RUNS)
    assert paths, f"no runs under {SAMPLE_RUNS}: create them with scripts/make_sample_runs.py"
    return {Path(p).name: load_run(p) for p in paths}


def test_one_run_per_rule_and_model(runs):
    assert set(runs) == set(RUNS)
    for name, run in runs.items():
        rule, model, _, _ = RUNS[name]
        assert run.meta["weighting"]["name"] == rule
        assert run.meta["model"] == model
        assert run.meta["finished"] is True
        assert run.rows_dropped == 0


def test_most_steps_have_a_gradient(runs):
    for name, run in runs.items():
        live = (run.steps.groupby("step")["grad_norm"].max() > 0).mean()
        assert live >= RUNS[name][3], f"{name}: {live:.0%} of steps had a gradient"


def test_the_lab_model_learns_under_grpo(runs):
    # The organism's promise (docs/study.md): held-out exact match rises by >= 0.10 over a GRPO run.
    ev = runs["lab_grpo"].evals
    acc = ev.groupby("step").apply(lambda e: (e["accuracy"] * e["n"]).sum() / e["n"].sum())
    assert acc.index.min() == -1, "no evaluation before the first update"
    assert acc.iloc[-1] - acc.loc[-1] >= 0.10, acc.to_dict()


@pytest.mark.parametrize("table", sorted(schema.TABLES))
def test_every_file_has_the_fixed_columns_with_their_dtypes(runs, table):
    want = schema.arrow_schema(table)
    for name, run in runs.items():
        files = run.files(table)
        version = run.meta["schema_version"]
        if version < TABLES_ADDED_IN.get(table, 0):
            assert not files, f"{name}: {table} files in a version-{version} run"
            continue
        if table == "whatif" and not run.meta.get("whatif_every"):  # written with WhatIf only
            assert not files, f"{name}: whatif files without what-if rules"
            continue
        if table in ("prob_bins", "vocab") and not run.meta.get("token_budget"):  # under a budget only
            assert not files, f"{name}: {table} files without a token budget"
            continue
        assert files, f"{name}: no {table} files"
        newer = {c for v, cols in ADDED_IN.items() if v > version for c in cols}
        for path in files:
            got = pq.read_schema(path)
            for field in want:
                if field.name in newer and field.name not in got.names:
                    continue
                assert field.name in got.names, f"{path}: column {field.name} missing"
                assert got.field(field.name).type == field.type, (
                    f"{path}: {field.name} is {got.field(field.name).type}"
                )


def test_runs_are_long_enough_and_analysed(runs):
    for name, run in runs.items():
        steps = run.steps
        assert steps["step"].nunique() >= RUNS[name][2], name
        assert sorted(steps["step"].unique()) == list(range(steps["step"].nunique())), name
        cfg, last = run.meta["config"], steps["step"].max()
        every, attributed = cfg["bucket_every"], cfg.get("attribute_every", 0)
        # an attribution step also runs the bucket analysis (its update shares come from the same pass)
        want = set(range(0, last + 1, every)) | (set(range(0, last + 1, attributed)) if attributed else set())
        assert every > 0 and set(run.buckets["step"]) == want, name
        assert run.evals["step"].min() == -1, name  # the baseline before the first update
        levels = next(n for prefix, n in LEVELS.items() if name.startswith(prefix))
        assert run.evals["difficulty"].nunique() == levels, name
        assert run.evals["accuracy"].between(0, 1).all(), name


def _updates_with_gradient(run):
    """Bucket rows of the analysed updates that had a gradient (a step whose every group tied in reward has
    zero advantages, g = 0 and no update shares)."""
    b = run.buckets
    return b[b.groupby(["step", "update_id"])["grad_norm"].transform("max") > 0]


def test_bucket_update_shares_sum_to_one(runs):
    # update_share = <g_B, g> / |g|^2 over the buckets and the residual partitions the update: sum = 1.
    n_checked = 0
    for name, run in runs.items():
        sums = _updates_with_gradient(run).groupby(["step", "update_id"])["update_share"].sum()
        np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-3, err_msg=name)
        n_checked += len(sums)
    assert n_checked > 0, "no analysed update had a gradient in any sample run"


def test_token_gradient_norm_is_coef_times_unit_norm(runs):
    for name, run in runs.items():
        t = run.tokens(columns=["coef", "logit_grad_unit", "logit_grad_norm", "prob", "sum_p2"], steps=(0, 5))
        assert len(t) > 0, name
        np.testing.assert_allclose(
            t["logit_grad_norm"], t["coef"].abs() * t["logit_grad_unit"], rtol=1e-4, atol=1e-7
        )
        np.testing.assert_allclose(
            t["logit_grad_unit"] ** 2, 1 - 2 * t["prob"] + t["sum_p2"], rtol=1e-3, atol=1e-5
        )


def test_lopti_makes_two_updates_and_the_others_one(runs):
    for name, run in runs.items():
        n = run.steps.loc[run.steps["grad_norm"] > 0, "n_updates"]
        assert len(n) > 0, f"{name}: no step had a learning signal"
        two = RUNS[name][0] == "ar_lopti" or run.meta["config"]["num_iterations"] == 2
        assert set(n) == ({2} if two else {1}), name


def test_same_seed_same_first_prompts(runs):
    # The runs differ only in the rule: step 0 samples the same prompts and (same policy) the same
    # completions.
    first = {
        name: run.samples[run.samples["step"] == 0].sort_values("sample_id") for name, run in runs.items()
    }
    for name, s in first.items():
        if name in OWN_SEED:
            continue
        family = name.removesuffix(RUNS[name][0]) + "grpo"  # lab_kk_tr_grpo -> lab_kk_grpo
        ref = first[SAME_STEP0.get(name, family)]
        assert s["prompt"].tolist() == ref["prompt"].tolist(), name
        if name not in SAME_PROMPTS_ONLY:
            assert s["completion"].tolist() == ref["completion"].tolist(), name


def test_every_export_figure_has_data(runs):
    from tokengrad.figures.figureset import build_figure_set

    specs, notes, failed = build_figure_set(runs, max_words=30)
    assert failed == []
    # The only figures a run may lack: the bucket analysis, when each of its analysed steps had no gradient
    # (and then the note says so, instead of drawing NaN shares).
    dead = "all 4 analysed steps had no gradient (every advantage was 0)"
    no_shares = {
        f"{kind}_{n}: {dead}"
        for n, r in runs.items()
        if _updates_with_gradient(r).empty
        for kind in ("bucket_shares", "bucket_update_share")
    }
    assert set(notes) <= no_shares
    with_whatif = sum(1 for r in runs.values() if r.meta.get("whatif_every"))  # one what-if figure each
    assert len(specs) + len(notes) == 6 + 6 * len(runs) + with_whatif  # 6 comparison figures (headline first)


def test_sample_runs_fit_the_size_limit():
    size = sum(p.stat().st_size for p in SAMPLE_RUNS.rglob("*") if p.is_file())
    assert 0 < size <= SIZE_LIMIT, f"sample_runs is {size / 2**20:.1f} MB"
    assert not list(SAMPLE_RUNS.rglob("checkpoint")), "model checkpoints must not ship"


def test_the_kk_runs_word_clouds_show_words(runs):
    # TR-GRPO Fig. 1 compares high- and low-probability words; on lab-add the clouds can only hold digits
    from tokengrad.figures.wordclouds import prepare_frequencies
    from tokengrad.read.queries import token_frequencies

    for name in [n for n in runs if n.startswith("lab_kk_")]:
        for lo, hi in ((0.0, 0.25), (0.75, 1.0)):
            words = prepare_frequencies(token_frequencies(runs[name], lo, hi))
            alphabetic = [w for w in words if w.isalpha() and len(w) > 1]
            assert len(alphabetic) >= 4, (name, lo, dict(words))


def test_the_rollout_run_has_a_real_gap_masked_sequences_and_stale_rows(runs):
    from tokengrad.read import rollout_queries as rq

    run = runs["lab_grpo_rollout"]
    cfg = run.meta["config"]
    assert cfg["bf16"] and cfg["top_p"] < 1 and cfg["rollout_correction"] == "sequence_mask"
    gap = rq.gap_summary(run)
    # bf16 logits and top-p renormalisation: a gap of 1e-2 nats, five orders above the fp32 runs' rounding
    assert 3e-3 < gap["mismatch_abs_mean"] < 0.1, gap
    assert runs["lab_grpo"].steps["rollout_mismatch"].max() < 1e-5
    masked = rq.masked_sequences(run)
    assert len(masked) > 0 and set(masked["masked_by"]) == {"is_sequence_mask"}
    assert (run.steps["is_masked_sequences"] > 0).mean() > 0.9
    # a masked sequence's weight is exp(sum d) < C_min: its sequence log ratio is below log C_min
    assert (masked["rollout_seq_log_ratio"] < np.log(cfg["rollout_correction_clip_min"])).all()
    # mu = 2: update 1 trains on samples one version old, so the staleness split has stale rows
    assert gap["n_stale"] > 0 and gap["lag_max"] == 1 and gap["staleness_abs_mean"] > 0


def test_the_entropy_run_checks_the_entropy_law(runs):
    from tokengrad.read.entropy_law import entropy_law, entropy_law_fit
    from tokengrad.read.entropy_queries import entropy_steps

    run = runs["lab_grpo_entropy"]
    steps = entropy_steps(run)
    assert steps["step"].tolist() == list(range(0, 100, 5))
    assert (run.steps["n_nonfinite"] == 0).all()  # every attributed update had a gradient (seed 1)
    fit = entropy_law_fit(entropy_law(run))
    pooled = fit.iloc[-1]
    # arXiv 2602.03392's per-token law against the measured change at lr 3e-5 (docs/study.md)
    assert pooled["n"] > 4000 and pooled["pearson"] > 0.85 and 0.7 < pooled["slope"] < 1.0, pooled.to_dict()
    first = entropy_law_fit(entropy_law(run), pred="dentropy_pred").iloc[-1]  # first order is exact here
    assert first["pearson"] > 0.99 and first["slope"] == pytest.approx(1.0, abs=0.05), first.to_dict()


def test_the_whatif_run_compares_rules_on_the_same_states(runs):
    from tokengrad.read.whatif_frames import ACTUAL, bucket_share_table, norm_trajectories

    run = runs["lab_grpo_whatif"]
    w = run.table("whatif")
    assert sorted(set(w["rule"])) == ["lopti", "tr_grpo"] and sorted(set(w["step"])) == list(range(0, 100, 5))
    norms = norm_trajectories(w, run.layers)
    assert set(norms["series"]) == {ACTUAL, "lopti", "tr_grpo"}
    live = norms[norms["grad_norm"] > 0]
    tr = live[live["series"] == "tr_grpo"].set_index("step")["grad_norm"]
    act = live[live["series"] == ACTUAL].set_index("step")["grad_norm"]
    assert (tr.sub(act).abs() > 1e-3 * act).any()  # TR-GRPO's weights (1 to 1.4) change the step
    shares = bucket_share_table(w, run.buckets)
    total = shares.groupby("series")["update_share"].sum()
    assert total.sub(1.0).abs().max() < 1e-3, total.to_dict()  # each update split over the buckets


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_page_has_content_or_says_why(name, monkeypatch):
    """Each dashboard page on each shipped run alone: a chart or a table, or an info box that names the
    run and says what it lacks and how to record it (never a blank page, an error or a warning)."""
    from streamlit.testing.v1 import AppTest

    from tokengrad.read import served_root

    monkeypatch.setenv(served_root.ENV_ROOT, str(SAMPLE_RUNS))
    at = AppTest.from_file(str(ROOT / "tokengrad" / "app" / "streamlit_app.py"), default_timeout=120)
    at.query_params["runs"] = name
    at.run()
    why = {}
    for page in PAGES:
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (name, page, [e.value for e in at.exception])
        assert not at.warning, (name, page, [w.value for w in at.warning])
        content = len(at.get("plotly_chart")) + len(at.dataframe)
        notes = [i.value for i in at.info if name in i.value]
        assert content or notes, f"{page} shows nothing for {name}"
        if not content:
            why[page] = notes
    # the only page that may be empty: Entropy on a run without entropy attribution, and it says how
    assert set(why) <= {"entropy", "whatif"}, why  # pages of runs recorded without those options
    assert ("entropy" in why) == (not runs_config(name).get("attribute_entropy")), why
    if "entropy" in why:
        assert "attribute_entropy" in why["entropy"][0]


def runs_config(name: str) -> dict:
    return load_run(SAMPLE_RUNS / name).meta["config"]


def test_the_shipped_demo_run_is_the_smollm_grpo_sample_run():
    """tokengrad/demo (package data, opened by `tokengrad dashboard` where there are no runs) is a copy of a
    sample run: remaking sample_runs/ must refresh it too."""
    from tokengrad.read.served_root import DEMO_ROOT

    demo, sample = DEMO_ROOT / "smollm_grpo", SAMPLE_RUNS / "smollm_grpo"
    files = lambda root: {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert files(demo) == files(sample) and files(demo)
    assert sum(len(b) for b in files(demo).values()) < 300_000  # a few hundred KB in the wheel
