"""The confidence floor (``cosmos_pl.clustering.confidence``): flat pseudo-labels re-tempered before the client
distances, worked out by hand."""

import math

import numpy as np
import pytest
import torch

from cosmos_pl.clustering import cluster_inputs, mean_confidence, pairwise_distances, temper_to_floor


def test_one_sample_is_lifted_to_the_floor_by_the_exponent_worked_out_by_hand():
    # p = (0.6, 0.4) to a top probability of 0.75: 0.6^b / (0.6^b + 0.4^b) = 0.75 <=> 1.5^b = 3, b = ln 3 / ln 1.5
    p = torch.tensor([[[0.6, 0.4]], [[0.9, 0.1]]])
    out, betas = temper_to_floor(p, 0.75)
    # (rel 1e-6: the uploads are float32, in which 0.6 is 0.6000000238)
    assert list(betas) == [0] and betas[0] == pytest.approx(math.log(3) / math.log(1.5), rel=1e-6)
    assert out[0, 0].tolist() == pytest.approx([0.75, 0.25], abs=1e-6)
    assert out[1].tolist() == p[1].tolist()  # 0.9 is above the floor: untouched
    assert mean_confidence(out) == pytest.approx([0.75, 0.9])
    assert temper_to_floor(p, 0.0)[0] is p  # no floor: the uploads themselves
    with pytest.raises(ValueError, match=r"confidence_floor=1.0: give a mean top probability in \[0, 1\)"):
        temper_to_floor(p, 1.0)


def test_flat_clients_of_two_groups_stop_looking_alike():
    # Four classes, two public samples. Client 0 (group A, flat) favours class 0 then 1 at 0.4 (0.2 elsewhere);
    # client 1 (group B, flat) favours 2 then 3 the same way; client 2 (group A, confident) puts 0.85 on 0 then 1.
    flat_a = [[0.4, 0.2, 0.2, 0.2], [0.2, 0.4, 0.2, 0.2]]
    flat_b = [[0.2, 0.2, 0.4, 0.2], [0.2, 0.2, 0.2, 0.4]]
    sure_a = [[0.85, 0.05, 0.05, 0.05], [0.05, 0.85, 0.05, 0.05]]
    p = torch.tensor([flat_a, flat_b, sure_a])
    # plain L1 per sample: d(0, 1) = 0.2 + 0.2 = 0.4 and d(0, 2) = 0.45 + 3 * 0.15 = 0.9: the flat client is nearer
    # the other group's flat client than its own group's
    plain = pairwise_distances(p)
    assert plain[0, 1] == pytest.approx(0.4) and plain[0, 2] == pytest.approx(0.9)
    # floor 0.6: 2^b / (2^b + 3) = 0.6 <=> 2^b = 4.5; each flat row becomes (0.6, 2/15, 2/15, 2/15) in its own order:
    # d(0, 1) = 2 * (0.6 - 2/15) = 0.9333 and d(0, 2) = (0.85 - 0.6) + 3 * (2/15 - 0.05) = 0.25 + 0.25 = 0.5
    got = cluster_inputs(p, "l1", 0.6)
    assert sorted(got.tempered) == [0, 1] and got.tempered[0] == pytest.approx(math.log2(4.5), rel=1e-6)
    assert got.distances[0, 1] == pytest.approx(2 * (0.6 - 2 / 15), abs=1e-6)
    assert got.distances[0, 2] == pytest.approx(0.5, abs=1e-6)
    assert got.samples == 2 and got.uninformative == []
    # l1_hard reads the argmax only, which tempering keeps: no client is re-tempered there
    hard = cluster_inputs(p, "l1_hard", 0.6)
    assert hard.tempered == {} and np.allclose(hard.distances, pairwise_distances(p, "l1_hard"))


def test_an_output_flat_on_every_sample_stops_at_the_largest_exponent():
    # every class tied: no exponent lifts the top probability, the client keeps its uniform output
    p = torch.full((2, 3, 4), 0.25)
    p[1] = torch.tensor([0.7, 0.1, 0.1, 0.1])
    out, betas = temper_to_floor(p, 0.6)
    assert list(betas) == [0] and torch.allclose(out[0], p[0])


def test_the_callers_uploads_are_never_re_tempered_in_their_place():
    flat = torch.tensor([[[0.4, 0.3, 0.3], [0.3, 0.4, 0.3]]] * 3)
    flat[2] = torch.tensor([[0.9, 0.05, 0.05], [0.05, 0.9, 0.05]])
    before = flat.clone()
    got = cluster_inputs(flat, "l1", 0.6)  # all of U read: the uploads themselves, so a copy is re-tempered
    assert sorted(got.tempered) == [0, 1] and torch.equal(flat, before)
    # a budget that affords fewer samples than U holds reads a subsample (a copy): still the caller's rows untouched
    many = torch.cat([flat] * 200, dim=1)  # [3, 400, 3]
    kept = many.clone()
    got = cluster_inputs(many, "l1", 0.6, budget=3 * 256 * 3)
    assert got.samples == 256 and torch.equal(many, kept)
    out, _ = temper_to_floor(flat, 0.6, in_place=True)  # asked for explicitly: the rows themselves
    assert torch.equal(out, flat) and not torch.equal(flat, before)


def test_the_floor_is_the_default_rules_and_a_number_applies_to_every_rule():
    from cosmos_pl.algorithms import COSMOS
    from cosmos_pl.clustering import DEFAULT_CONFIDENCE_FLOOR
    from cosmos_pl.errors import ConfigError

    assert COSMOS(teacher_backbone="test_efficientnet").confidence_floor == DEFAULT_CONFIDENCE_FLOOR == 0.5
    # a threshold rule or a B0 from the paper reads the paper's plain distance unless a floor is given
    assert COSMOS(teacher_backbone="test_efficientnet", b0=0.8).confidence_floor == 0.0
    assert COSMOS(teacher_backbone="test_efficientnet", b0="strict").confidence_floor == 0.0
    assert COSMOS(teacher_backbone="test_efficientnet", b0="strict", confidence_floor=0.3).confidence_floor == 0.3
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match=r"algorithm.init_args.confidence_floor=.*: must be a mean top probability"):
            COSMOS(teacher_backbone="test_efficientnet", confidence_floor=bad)
    with pytest.raises(ValueError, match=r"confidence_floor=1.5"):  # refused whatever the metric
        cluster_inputs(torch.full((2, 3, 2), 0.5), "l1_hard", 1.5)
