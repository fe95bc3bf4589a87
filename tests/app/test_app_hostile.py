"""The dashboard against hostile input: URL state that does not parse or is out of range, one very long
token, and a live refresh that keeps re-reading a growing run (the cache stays bounded)."""

from __future__ import annotations

import time

import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest
from test_app import APP, N_STEPS, _write, good_root  # noqa: F401 - good_root is a fixture

from tokengrad import schema
from tokengrad.figures.style import MAX_TOKEN_CHARS
from tokengrad.figures.tokens import display_token
from tokengrad.figures.wordclouds import prepare_frequencies, wordcloud_png
from tokengrad.read import served_root


@pytest.mark.parametrize("smooth", ["5", "-1", "1e999", "nan", "inf", "abc"])
def test_url_smoothing_out_of_range_keeps_the_default(good_root, monkeypatch, smooth):  # noqa: F811
    monkeypatch.setenv(served_root.ENV_ROOT, str(good_root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["smooth"] = smooth
    at.query_params["x"] = "not an axis"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    default = AppTest.from_file(str(APP), default_timeout=60).run()
    assert at.slider(key="ov_smooth").value == default.slider(key="ov_smooth").value
    assert at.radio(key="ov_x").value == default.radio(key="ov_x").value


def test_url_smoothing_in_range_is_taken(good_root, monkeypatch):  # noqa: F811
    monkeypatch.setenv(served_root.ENV_ROOT, str(good_root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["smooth"] = "0.25"
    at.run()
    assert at.slider(key="ov_smooth").value == pytest.approx(0.25)


def test_a_one_megabyte_token_is_capped_in_the_word_cloud_and_the_inspector():
    long = "A" * 1_000_000
    freqs = prepare_frequencies(pd.DataFrame({"token": ["b", "c", "d", long], "count": [12] * 4}))
    capped = "A" * (MAX_TOKEN_CHARS - 1) + "…"
    assert freqs == {"b": 12.0, "c": 12.0, "d": 12.0, capped: 12.0}
    t0 = time.perf_counter()
    png = wordcloud_png(freqs, width=200, height=120)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and time.perf_counter() - t0 < 60
    assert display_token(long) == capped
    assert display_token("ab\ncd") == "ab↵cd"  # short tokens as before


def test_live_refresh_keeps_one_cached_copy_of_a_growing_table(tmp_path):
    from streamlit.runtime.caching import cache_data_api

    from tokengrad.app import data

    run = _write(tmp_path / "live", seed=4)
    data._load_table.clear()
    folder = run / "steps" / "rank000"
    first = pq.read_table(folder / schema.file_name(0, N_STEPS - 1)).slice(0, 1)

    def entries() -> list:
        stats = [s for family in cache_data_api._data_caches.get_stats().values() for s in family]
        return [s for s in stats if s.cache_name.endswith("_load_table")]

    sizes = []
    for k in range(12):  # each refresh finds one more step file: a new signature
        step = N_STEPS + k
        row = first.set_column(0, "step", pc.cast(pc.add(first.column("step"), step), "int32"))
        pq.write_table(row, folder / schema.file_name(step, step))
        assert len(data.table(str(run), "steps")) == step + 1
        sizes.append(sum(s.byte_length for s in entries()))
    assert len(entries()) == 1  # the superseded copies were dropped
    assert sizes[-1] < 2 * sizes[0]  # one table's worth, not twelve
