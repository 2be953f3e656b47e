"""Permissible transformations and perturbations stay in a documented range: pixel space [0, 1], before
normalization (a perturbation clamped to [0, 1] after normalizing to [-1, 1] would move pixels out of their range)."""

import math

import torch

from cosmos_pl.transforms import Transformations, normalize, prepare, to_unit


def test_perturbed_views_stay_in_range_and_inside_the_ball():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    t = Transformations(translate=0, hflip=False, noise_radius=0.1)
    unit = to_unit(x)
    view = t.perturb(unit)
    assert view.min() >= 0 and view.max() <= 1
    dist = (view - unit).flatten(1).norm(dim=1)
    assert (dist <= 0.1 * math.sqrt(3 * 8 * 8) + 1e-5).all() and (dist > 0).any()
    model_in = prepare(x, t, perturb=True)
    assert model_in.min() >= -1 and model_in.max() <= 1


def test_translation_is_an_integer_shift_with_zero_fill():
    torch.manual_seed(1)
    x = torch.rand(32, 1, 6, 6) + 0.1  # strictly positive, so zero fill is visible
    out = Transformations(translate=1, hflip=False, noise_radius=0).augment(x)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    for b in range(32):
        shifts = [padded[b, :, dy:dy + 6, dx:dx + 6] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(out[b], s) for s in shifts)


def test_normalize_maps_unit_interval_to_symmetric_range():
    assert normalize(torch.tensor([0.0, 0.5, 1.0])).tolist() == [-1.0, 0.0, 1.0]
