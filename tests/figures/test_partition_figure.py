"""The update-share-by-partition figure (buckets page): bars are the query's numbers, labels name parts."""

import numpy as np
import pandas as pd
import pytest

from tokengrad.figures.probability import make_partition_share_figure, partition_labels


def _shares(update_share):
    return pd.DataFrame(
        {
            "lo": [-1, 0, 1],
            "hi": [-1, 0, 1],
            "count": [2, 1, 1],
            "token_share": [0.5, 0.25, 0.25],
            "update_share": update_share,
        }
    )


def test_bars_carry_token_and_update_shares():
    fig = make_partition_share_figure(_shares([0.3, 0.0, 0.7]), "adv_sign", title="t")
    bars = {t.name: t for t in fig.data}
    assert list(bars) == ["share of loss tokens", "share of the update (per-token attribution)"]
    assert list(bars["share of loss tokens"].x) == ["A < 0", "A = 0", "A > 0"]
    np.testing.assert_allclose(bars["share of the update (per-token attribution)"].y, [0.3, 0.0, 0.7])
    np.testing.assert_allclose(bars["share of loss tokens"].y, [0.5, 0.25, 0.25])


def test_range_labels_and_empty_states():
    prob = pd.DataFrame({"lo": [0.0, 0.5], "hi": [0.5, 1.0]})
    assert partition_labels(prob, "prob") == ["0.00-0.50", "0.50-1.00"]
    assert partition_labels(pd.DataFrame({"lo": [0.0, 4.0], "hi": [4.0, 8.0]}), "position") == ["0-4", "4-8"]
    fig = make_partition_share_figure(_shares([np.nan] * 3), "adv_sign")
    assert "attribution=N" in fig.layout.annotations[0].text and not fig.data
    with pytest.raises(ValueError, match="unknown partition 'colour'"):
        make_partition_share_figure(_shares([0.3, 0.0, 0.7]), "colour")
