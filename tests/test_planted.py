"""The planted federations the clustering benchmarks read (cosmos_pl/clustering/planted.py): the per-client settings
that make the loose families, worked out by hand on a client with no noise."""

import numpy as np
import pytest

from cosmos_pl.clustering.planted import planted_uploads


def test_a_fully_competent_client_without_noise_uploads_its_class_as_the_generator_says():
    # competence 1 on every class it knows, no foreign class, no noise: on a public sample of one of its group's
    # classes y the mean is one-hot at y; the upload is softmax(log(mean + 1e-3)), so
    # p_y = 1.001 / (1.001 + 19 * 0.001) = 0.98137 with M = 20, and 0.001 / 1.02 on every other class
    uploads, groups = planted_uploads(10, num_classes=20, public=400, seed=3, competence=(1.0, 1.0), foreign=0.0,
                                      noise=0.0)
    assert uploads.shape == (10, 400, 20) and sorted(np.bincount(groups).tolist()) == [2] * 5
    top = uploads.max(dim=2).values
    # a client's own classes are 4 of 20: about a fifth of the samples are its own, each at exactly 0.98137
    assert np.isclose(top.numpy(), 1.001 / 1.02, atol=1e-6).sum(axis=1).min() > 0
    assert float(top.max()) == pytest.approx(1.001 / 1.02, abs=1e-6)


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match=r"competence=\(0.9, 0.5\): give \(low, high\)"):
        planted_uploads(10, competence=(0.9, 0.5))
    with pytest.raises(ValueError, match=r"foreign=1.5: must lie in \[0, 1\]"):
        planted_uploads(10, foreign=1.5)
    with pytest.raises(ValueError, match="noise=-1: must be >= 0"):
        planted_uploads(10, noise=-1)
