"""Cluster aggregation rules and exact byte counts."""

import pytest
import torch

from cosmos_pl.aggregation import aggregate
from cosmos_pl.communication import pseudo_label_bytes


def test_mean_median_max_by_hand():
    two = torch.tensor([[[0.6, 0.4]], [[0.2, 0.8]]])
    assert aggregate(two, "mean")[0].tolist() == pytest.approx([0.4, 0.6])
    assert aggregate(two, "max")[0].tolist() == pytest.approx([0.6 / 1.4, 0.8 / 1.4])
    # torch's median of two values is the lower one: [.2, .4] -> renormalized [1/3, 2/3]
    assert aggregate(two, "median")[0].tolist() == pytest.approx([1 / 3, 2 / 3])
    three = torch.tensor([[[0.6, 0.3, 0.1]], [[0.2, 0.5, 0.3]], [[0.1, 0.1, 0.8]]])
    # column medians .2 .3 .3 -> / .8
    assert aggregate(three, "median")[0].tolist() == pytest.approx([0.25, 0.375, 0.375])


def test_rows_stay_on_the_simplex():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(5, 7, 4), dim=-1)
    for rule in ("mean", "median", "max"):
        out = aggregate(p, rule)
        assert out.shape == (7, 4)
        assert torch.allclose(out.sum(1), torch.ones(7), atol=1e-6) and (out >= 0).all()


def test_unknown_rule_and_empty_cluster():
    with pytest.raises(ValueError, match="aggregation="):
        aggregate(torch.ones(1, 2, 2) / 2, "mode")
    with pytest.raises(ValueError):
        aggregate(torch.ones(0, 2, 2), "mean")


def test_byte_counts():
    assert pseudo_label_bytes(2000, 10) == 2000 * 10 * 4 == 80_000
    assert pseudo_label_bytes(2000, 10, "float16") == 40_000
    assert pseudo_label_bytes(2000, 100, "uint8") == 200_000
    with pytest.raises(ValueError, match="dtype"):
        pseudo_label_bytes(10, 10, "float64")
