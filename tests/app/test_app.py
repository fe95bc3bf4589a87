"""The dashboard through Streamlit's AppTest: every page on good runs, on broken runs, and without torch.

Runs are written with the synthetic writer of tests/synthetic_runs.py (pyarrow, schema.py layout), so
the expected numbers below are computed independently from the same parquet files with pyarrow.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest
from synthetic_runs import write_synthetic_run

from tokengrad import schema
from tokengrad.app.views import hints
from tokengrad.cli import dashboard
from tokengrad.read import served_root
from tokengrad.read.headline import low_prob_shares
from tokengrad.read.runs import load_run

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "tokengrad" / "app" / "streamlit_app.py"
PAGES = (
    "views/overview.py",
    "views/buckets.py",
    "views/wordclouds.py",
    "views/inspector.py",
    "views/evaluation.py",
)
N_STEPS, N_SAMPLES, N_TOK = 10, 4, 16


def _write(run: Path, seed: int, **kw) -> Path:
    return write_synthetic_run(run, n_steps=N_STEPS, n_samples=N_SAMPLES, n_tok=N_TOK, seed=seed, **kw)


@pytest.fixture(scope="module")
def good_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("good")
    _write(root / "grpo", seed=0)
    _write(root / "tr_grpo", seed=1)
    return root


@pytest.fixture(scope="module")
def broken_root(tmp_path_factory) -> Path:
    """Three runs: tables missing, corrupt parquet files, and an unreadable meta.json."""
    root = tmp_path_factory.mktemp("broken")
    _write(root / "partial", seed=2, tables=("steps",))
    corrupt = _write(root / "corrupt", seed=3)
    (corrupt / "tokens" / "rank000" / schema.file_name(0, N_STEPS - 1)).write_bytes(
        b"PAR1 not a parquet file"
    )
    layers = corrupt / "layers" / "rank000" / schema.file_name(0, N_STEPS - 1)
    layers.write_bytes(layers.read_bytes()[:100])  # truncated: footer gone
    bad = root / "badmeta"
    bad.mkdir()
    (bad / schema.META_FILE).write_text("{ not json")
    return root


def _app(root: Path, monkeypatch, page: str | None = None) -> AppTest:
    monkeypatch.setenv(served_root.ENV_ROOT, str(root))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _typed(value):
    """Plotly's JSON stores numeric arrays as {"dtype", "bdata": base64[, "shape"]}: decode to numpy."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return arr.reshape([int(n) for n in str(value["shape"]).split(",")]) if "shape" in value else arr
    return value


def _charts(at: AppTest) -> list[dict]:
    """Each chart's figure JSON, its traces' x/y decoded."""
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    for fig in figs:
        for trace in fig["data"]:
            trace.update({k: _typed(trace[k]) for k in ("x", "y") if k in trace})
    return figs


def _tokens(run: Path):
    return pq.read_table(next((run / "tokens" / "rank000").glob("*.parquet")))


# ---- good runs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_warnings(good_root, monkeypatch, page):
    at = _app(good_root, monkeypatch, page)
    assert not at.warning, [w.value for w in at.warning]
    assert at.get("plotly_chart"), f"{page} drew no chart"
    assert at.multiselect(key="tg_pick").value == ["grpo", "tr_grpo"]  # both runs picked by default


def test_overview_summary_finds_the_injected_spike(good_root, monkeypatch):
    at = _app(good_root, monkeypatch)
    summary = at.dataframe[0].value.set_index("run")
    for name in ("grpo", "tr_grpo"):
        gn = pq.read_table(good_root / name / "steps" / "rank000" / schema.file_name(0, N_STEPS - 1))
        grad = gn.column("grad_norm").to_numpy()
        # The writer multiplies one step's norm by 6 (10 steps // 100 -> 1 spike): that step, and only it.
        assert summary.loc[name, "spikes"] == 1
        assert summary.loc[name, "spike_steps"] == str(int(np.argmax(grad)))
        assert summary.loc[name, "steps"] == N_STEPS
        assert summary.loc[name, "rule"] == "synthetic"
        assert summary.loc[name, "status"] == "finished"
        head = low_prob_shares(load_run(good_root / name))  # the one definition, read from the parquet
        assert head.source == "bucket analysis" and 0 < head.update_share < 1
        assert summary.loc[name, "low_update"] == pytest.approx(head.update_share)
        assert summary.loc[name, "low_tokens"] == pytest.approx(head.token_share)
    # headline (update share by bucket, runs overlaid), training curves, total grad norm, per-layer, heatmap
    assert len(at.get("plotly_chart")) == 5


def test_bucket_page_shows_recorded_token_shares(good_root, monkeypatch):
    at = _app(good_root, monkeypatch, "views/buckets.py")
    charts = _charts(at)
    share_fig = next(f for f in charts if f["data"] and f["data"][0].get("name") == "share of loss tokens"
                     and schema.RESIDUAL_BUCKET in list(f["data"][0]["x"]))  # fmt: skip
    token_share = next(t for t in share_fig["data"] if t["name"] == "share of loss tokens")
    # n_tokens per bucket are 80, 70, 100, 750 (residual 0) -> shares 80/1000, 70/1000, 100/1000, 750/1000
    np.testing.assert_allclose(token_share["y"], [0.08, 0.07, 0.10, 0.75, 0.0])
    assert token_share["x"][-1] == schema.RESIDUAL_BUCKET


def test_bucket_page_headline_is_the_token_table_share_of_gradient(good_root, monkeypatch):
    """The run-wide figure: each quarter of [0, 1]'s share of loss tokens and of Σ logit_grad_norm,
    recomputed from the parquet file with numpy."""
    at = _app(good_root, monkeypatch, "views/buckets.py")
    fig = next(f for f in _charts(at) if any(t.get("name") == "share of loss tokens" for t in f["data"]))
    t = _tokens(good_root / "grpo")
    prob, grad = t.column("prob").to_numpy(), t.column("logit_grad_norm").to_numpy().astype(float)
    idx = np.minimum((prob * 4).astype(int), 3)  # [0, .25), ..., [.75, 1]
    counts = np.bincount(idx, minlength=4)
    sums = np.bincount(idx, weights=grad, minlength=4)
    bars = {tr["name"]: tr["y"] for tr in fig["data"]}
    np.testing.assert_allclose(bars["share of loss tokens"], counts / counts.sum(), rtol=1e-6)
    np.testing.assert_allclose(bars["share of summed per-token gradient norm"], sums / sums.sum(), rtol=1e-4)
    assert f"{N_STEPS} live of {N_STEPS} steps" in fig["layout"]["title"]["text"]


def _cloud_table(at: AppTest, which: int) -> dict[str, int]:
    df = at.dataframe[which].value
    return dict(zip(df["token"], df["count"]))


def test_wordcloud_counts_match_the_parquet_and_filters_apply(good_root, monkeypatch):
    at = _app(good_root, monkeypatch, "views/wordclouds.py")
    t = _tokens(good_root / "grpo")
    is_the = pc.is_in(t.column("token"), value_set=pc.cast(np.array(["the", " the"]), "string"))
    high = pc.greater_equal(t.column("prob"), 0.75)
    low = pc.less(t.column("prob"), 0.25)
    # 'the' and ' the' both clean to 'the' and are counted together.
    assert _cloud_table(at, 0)["the"] == pc.sum(pc.and_(is_the, high)).as_py()
    assert _cloud_table(at, 1)["the"] == pc.sum(pc.and_(is_the, low)).as_py()

    at.radio(key="wc_sign").set_value("positive advantage").run()
    pos = pc.greater(t.column("advantage"), 0)
    assert _cloud_table(at, 0)["the"] == pc.sum(pc.and_(pc.and_(is_the, high), pos)).as_py()

    at.text_input(key="wc_stops").set_value("the, and").run()
    assert not at.exception
    assert "the" not in _cloud_table(at, 0) and "and" not in _cloud_table(at, 0)


def test_inspector_colours_one_span_per_token_and_ranks_the_step(good_root, monkeypatch):
    at = _app(good_root, monkeypatch, "views/inspector.py")
    html = at.get("html")[0].proto.body
    assert html.count('class="tg-tok"') == N_TOK
    step = int(at.number_input(key="in_step").value)
    t = _tokens(good_root / "grpo")
    at_step = t.filter(pc.equal(t.column("step"), step))
    norms = at_step.column("logit_grad_norm").to_numpy()
    top = at.dataframe[1].value  # tokens carrying most of the step's gradient
    assert top["logit_grad_norm"].iloc[0] == pytest.approx(norms.max(), rel=1e-6)
    assert top["share"].iloc[0] == pytest.approx(norms.max() / norms.sum(), rel=1e-5)
    samples = at.dataframe[0].value
    assert samples["share"].sum() == pytest.approx(1.0)  # 4 samples, all listed (k=10)

    assert "pushed down" in html and "pushed up" in html  # coloured by -coef by default
    assert all("⟦" in c and "⟧" in c for c in top["context"])  # ±5 tokens around each ranked token
    at.selectbox(key="in_color").set_value("coef").run()
    assert not at.exception and at.get("html")[0].proto.body.count('class="tg-tok"') == N_TOK


def test_inspector_steps_by_number_spike_buttons_and_run_switch(good_root, monkeypatch):
    at = _app(good_root, monkeypatch, "views/inspector.py")
    largest = {}
    for name in ("grpo", "tr_grpo"):
        gn = pq.read_table(good_root / name / "steps" / "rank000" / schema.file_name(0, N_STEPS - 1))
        largest[name] = int(np.argmax(gn.column("grad_norm").to_numpy()))
    assert largest["grpo"] != largest["tr_grpo"]
    at.number_input(key="in_step").set_value(0).run()
    assert at.number_input(key="in_step").value == 0
    # the injected spike is the largest step: "next spike" from step 0 goes there, "previous" is disabled
    at.button(key="in_next").click().run()
    assert at.number_input(key="in_step").value == largest["grpo"]
    assert at.button(key="in_next").disabled and at.button(key="in_prev").disabled
    assert at.subheader[0].value.startswith(f"Gradient-norm spike {largest['grpo']}")
    at.selectbox(key="in_run").set_value(str(good_root / "tr_grpo")).run()  # another run: its largest step
    assert at.number_input(key="in_step").value == largest["tr_grpo"]


def test_evaluation_page_shows_last_accuracy_per_difficulty(good_root, monkeypatch):
    at = _app(good_root, monkeypatch, "views/evaluation.py")
    bars = _charts(at)[0]["data"]
    assert [b["name"] for b in bars] == ["grpo", "tr_grpo"]
    # The writer's accuracy at step s, difficulty index d: 0.3 + 0.4 s / 10 - 0.1 d; last eval at s = 5.
    np.testing.assert_allclose(bars[0]["y"], [0.5, 0.4, 0.3])
    assert list(bars[0]["x"]) == ["3", "4", "5"]


def test_live_refresh_toggle_polls_without_error(good_root, monkeypatch):
    at = _app(good_root, monkeypatch)
    at.toggle(key="tg_live").set_value(True).run()
    assert not at.exception
    assert any(c.value.startswith("checked ") for c in at.sidebar.caption)


def test_no_run_selected_explains_how_to_get_one(good_root, monkeypatch):
    at = _app(good_root, monkeypatch)
    at.multiselect(key="tg_pick").set_value([]).run()
    assert not at.exception
    assert "No run selected" in at.info[0].value


def test_inspector_opens_at_the_largest_gradient_step(good_root, monkeypatch):
    at = _app(good_root, monkeypatch, "views/inspector.py")
    gn = pq.read_table(good_root / "grpo" / "steps" / "rank000" / schema.file_name(0, N_STEPS - 1))
    assert at.number_input(key="in_step").value == int(np.argmax(gn.column("grad_norm").to_numpy()))


@pytest.fixture(scope="module")
def dead_root(tmp_path_factory) -> Path:
    """One run whose every step had all advantages 0, one with the first half dead."""
    root = tmp_path_factory.mktemp("dead")
    _write(root / "dead", seed=6, dead=1.0)
    _write(root / "half", seed=7, dead=0.5)
    return root


def test_dead_steps_are_counted_and_explained(dead_root, monkeypatch):
    at = _app(dead_root, monkeypatch)
    summary = at.dataframe[0].value.set_index("run")
    assert summary.loc["dead", "no_gradient"] == f"{N_STEPS} of {N_STEPS} steps had no gradient"
    assert summary.loc["half", "no_gradient"] == f"{N_STEPS // 2} of {N_STEPS} steps had no gradient"
    assert f"dead: {N_STEPS} of {N_STEPS} steps had no gradient" in " ".join(c.value for c in at.caption)
    at.switch_page("views/inspector.py").run()
    assert at.number_input(key="in_step").value == N_STEPS - 1  # no gradient anywhere: the last step
    assert "had no gradient" in at.info[0].value
    at.switch_page("views/buckets.py").run()
    headline = _charts(at)[0]
    assert not headline["data"]
    why = headline["layout"]["annotations"][0]["text"]
    assert why.startswith(f"none of the {N_STEPS} steps had a gradient")
    assert not at.warning, [w.value for w in at.warning]


def test_picked_runs_and_settings_come_from_the_url(good_root, monkeypatch):
    monkeypatch.setenv(served_root.ENV_ROOT, str(good_root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["runs"] = "tr_grpo"
    at.query_params["smooth"] = "0.8"
    at.run()
    assert not at.exception
    assert at.multiselect(key="tg_pick").value == ["tr_grpo"]
    assert at.slider(key="ov_smooth").value == pytest.approx(0.8)
    at.multiselect(key="tg_pick").set_value(["grpo", "tr_grpo"]).run()
    assert at.query_params["runs"] in (["grpo,tr_grpo"], "grpo,tr_grpo")  # AppTest keeps lists


def test_new_run_folders_are_listed_and_picked(tmp_path, monkeypatch):
    _write(tmp_path / "a", seed=8, tables=("steps",))
    at = _app(tmp_path, monkeypatch)
    assert at.multiselect(key="tg_pick").value == ["a"]
    _write(tmp_path / "b", seed=9, tables=("steps",))
    at.run()
    assert at.multiselect(key="tg_pick").value == ["a", "b"]


# ---- broken runs -----------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:skipped corrupt file:RuntimeWarning")
@pytest.mark.parametrize("page", PAGES)
def test_broken_runs_warn_and_the_page_still_works(broken_root, monkeypatch, page):
    monkeypatch.setenv(served_root.ENV_ROOT, str(broken_root))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.multiselect(key="tg_pick").set_value(["badmeta", "corrupt", "partial"]).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = " ".join(w.value for w in at.warning)
    assert "cannot open run" in warnings and "badmeta" in warnings
    if page in ("views/overview.py", "views/evaluation.py"):  # pages that read every picked run
        errors = " ".join(e.value for e in at.error)
        assert "corrupt: " in errors and "unreadable" in errors  # one box per loss, the steps it held


def test_missing_tables_say_how_to_record_them(broken_root, monkeypatch):
    monkeypatch.setenv(served_root.ENV_ROOT, str(broken_root))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.multiselect(key="tg_pick").set_value(["partial"]).run()
    info = {p: " ".join(i.value for i in at.switch_page(p).run().info) for p in PAGES}
    assert "record_grad_norms" in info["views/overview.py"]
    assert "Recorder(..., buckets=N)" in info["views/buckets.py"]  # a plain loop's run: the Recorder option
    assert "st.track" in info["views/wordclouds.py"] and "st.track" in info["views/inspector.py"]
    assert "log_eval" in info["views/evaluation.py"]


def test_evaluation_opens_on_the_task_most_runs_share():
    import pandas as pd

    from tokengrad.app.views.evaluation import shared_tasks

    ev = {
        "a": pd.DataFrame({"task": ["zeta", "zeta", "alpha"]}),
        "b": pd.DataFrame({"task": ["zeta"]}),
        "c": pd.DataFrame({"task": ["beta"]}),
    }
    assert shared_tasks(ev) == ["zeta", "alpha", "beta"]  # 2 runs, then 1 run each by name


def test_hints_match_how_the_run_was_made():
    trl = {"config": {"integration": "trl", "args": {"max_steps": 5}}}
    trainer = {"config": {"task": "lab_add", "prompts_per_step": 8, "group_size": 8, "bucket_every": 0}}
    loop = {"config": {"lr": 1e-3}}
    assert [hints.origin(m) for m in (trl, trainer, loop, {})] == ["trl", "trainer", "loop", "loop"]
    assert "attach(trainer, dir, buckets=N)" in hints.hint(trl, "buckets")
    assert "attach(trainer, dir, attribution=N)" in hints.hint(trl, "attribution")
    assert "`bucket_every = N`" in hints.hint(trainer, "buckets")
    assert "`attribute_every = N`" in hints.hint(trainer, "attribution")
    assert "Recorder(..., buckets=N)" in hints.hint(loop, "buckets")
    assert "Recorder(..., attribution=N)" in hints.hint(loop, "attribution")
    with pytest.raises(ValueError, match="known"):
        hints.hint(loop, "nope")


def test_empty_root_says_there_are_no_runs(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch)
    assert "No runs" in " ".join(c.value for c in at.sidebar.caption)
    assert "No run selected" in at.info[0].value


@pytest.mark.skipif(
    not any((REPO / "sample_runs").glob("*/meta.json")), reason="sample_runs/ not generated yet"
)
@pytest.mark.parametrize("page", PAGES)
def test_sample_runs_render(monkeypatch, page):
    at = _app(REPO / "sample_runs", monkeypatch, page)
    assert not at.warning, [w.value for w in at.warning]


# ---- data layer ------------------------------------------------------------------------------------
def test_cache_is_keyed_on_file_changes(tmp_path, monkeypatch):
    from tokengrad.app import data

    run = _write(tmp_path / "live", seed=4)
    opened = []
    real = data.load_run
    monkeypatch.setattr(data, "load_run", lambda p: opened.append(p) or real(p))
    data._load_table.clear()
    assert len(data.table(str(run), "steps")) == N_STEPS
    assert len(data.table(str(run), "steps")) == N_STEPS
    assert len(opened) == 1  # second call served from the cache
    # A new step file lands (as the writer commits one per step): the signature changes, rows appear.
    steps = pq.read_table(run / "steps" / "rank000" / schema.file_name(0, N_STEPS - 1)).slice(0, 1)
    steps = steps.set_column(0, "step", pc.cast(pc.add(steps.column("step"), N_STEPS), "int32"))
    pq.write_table(steps, run / "steps" / "rank000" / schema.file_name(N_STEPS, N_STEPS))
    assert len(data.table(str(run), "steps")) == N_STEPS + 1
    assert len(opened) == 2


def test_signature_ignores_writer_temp_files(tmp_path):
    from tokengrad.app import data

    run = _write(tmp_path / "r", seed=5, tables=("steps",))
    before = data.signature(str(run))
    (run / "steps" / "rank000" / ".s00000010-00000010.parquet.tmp").write_bytes(b"partial")
    assert data.signature(str(run)) == before
    assert [s[0] for s in before] == [
        "meta.json",
        os.path.join("steps", "rank000", schema.file_name(0, N_STEPS - 1)),
    ]


def test_unknown_query_and_table_are_named(good_root):
    from tokengrad.app import data

    with pytest.raises(ValueError, match="known: .*token_frequencies"):
        data.query(str(good_root / "grpo"), "drop_everything")
    with pytest.raises(ValueError, match="small tables"):
        data.table(str(good_root / "grpo"), "tokens")


@pytest.mark.subprocess
def test_app_never_imports_torch(good_root):
    """Every page rendered in a fresh interpreter; torch must not be loaded, not even transitively."""
    code = textwrap.dedent(f"""
        import os, sys
        os.environ[{served_root.ENV_ROOT!r}] = {str(good_root)!r}
        import tokengrad.app.data, tokengrad.app.views.common, tokengrad.app.views.sidebar
        import tokengrad.cli.dashboard
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file({str(APP)!r}, default_timeout=60).run()
        for page in {list(PAGES)!r}:
            at.switch_page(page).run()
            assert not at.exception, page
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:5]
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ---- `tokengrad dashboard` ----------------------------------------------------------------------------
def test_dashboard_command_binds_localhost_and_passes_the_root(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(dashboard.subprocess, "call", lambda cmd, env: calls.append((cmd, env)) or 0)
    assert dashboard.cli_dashboard([str(tmp_path), "--port", "8612"]) == 0
    cmd, env = calls[0]
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4] == str(APP)
    opts = dict(zip(cmd[5 : cmd.index("--")][::2], cmd[5 : cmd.index("--")][1::2]))
    assert opts["--server.address"] == "127.0.0.1" and opts["--server.port"] == "8612"
    assert opts["--server.headless"] == "true" and opts["--browser.gatherUsageStats"] == "false"
    assert cmd[cmd.index("--") + 1 :] == ["--root", str(tmp_path.resolve())]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)

    assert dashboard.cli_dashboard([str(tmp_path), "--host", "0.0.0.0"]) == 0
    assert calls[1][0][calls[1][0].index("--server.address") + 1] == "0.0.0.0"


def test_dashboard_root_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv(served_root.ENV_ROOT, raising=False)
    monkeypatch.chdir(tmp_path)
    assert served_root.resolve_root(None) == tmp_path.resolve()  # the current folder
    monkeypatch.setenv(served_root.ENV_ROOT, str(tmp_path / "env_runs"))
    assert served_root.resolve_root(None) == (tmp_path / "env_runs").resolve()
    assert served_root.resolve_root("explicit") == (tmp_path / "explicit").resolve()


def test_dashboard_rejects_missing_root_and_bad_port(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dashboard.subprocess, "call", lambda *a, **k: pytest.fail("server started"))
    assert dashboard.cli_dashboard([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse: usage + one error line, exit 2
        dashboard.cli_dashboard([str(tmp_path), "--port", "70000"])
    assert exit_.value.code == 2 and "port 70000 is out of range 1-65535" in capsys.readouterr().err


def test_root_from_script_arguments():
    from tokengrad.app.views.sidebar import root_from_argv

    assert root_from_argv(["--root", "runs/x"]) == "runs/x"
    assert root_from_argv(["-x", "-q", "tests/app/test_app.py"]) is None  # pytest's own argv is ignored


@pytest.mark.skipif(
    not (REPO / "sample_runs" / "lab_kk_grpo" / "meta.json").exists(), reason="sample_runs/ not generated yet"
)
def test_word_clouds_say_when_a_budget_kept_only_some_rows(monkeypatch, tmp_path):
    # lab_kk_grpo kept 512 token rows per step, lab_grpo every row: only the first gets the note
    for name, noted in (("lab_kk_grpo", True), ("lab_grpo", False)):
        root = tmp_path / name
        root.mkdir()
        shutil.copytree(REPO / "sample_runs" / name, root / name)
        at = _app(root, monkeypatch, "views/wordclouds.py")
        said = " ".join(i.value for i in at.info)
        assert ("kept at most 512 token rows per step" in said) == noted, said
