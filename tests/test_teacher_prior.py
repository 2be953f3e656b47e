"""The cluster teacher scored as the client would use it: its probabilities shifted to the client's own label
prior (``teacher_prior``), beside the teacher's own accuracy."""

import math

import torch
from torch import nn

from cosmos_pl.losses import adjust_to_prior
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.inference import evaluate_models

CPU = TrainerConfig(accelerator="cpu", channels_last=False)


class _Fixed(nn.Module):
    """Probabilities [0.5, 0.5] for a black image (U here), [0.6, 0.4] for a white one (the client's test images)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        white = (x.flatten(1).mean(1, keepdim=True) > 0).float()
        probs = white * torch.tensor([0.6, 0.4]) + (1 - white) * torch.tensor([0.5, 0.5])
        return probs.log() + self.bias


def test_a_source_prior_given_replaces_the_mean_of_the_probabilities():
    p = torch.tensor([[0.6, 0.4]])
    # pi_i = (0 + 1, 8 + 1) / 10 = [0.1, 0.9]; carried [0.5, 0.5]: [0.6 * 0.2, 0.4 * 1.8] = [0.12, 0.72] -> 1/7, 6/7
    torch.testing.assert_close(adjust_to_prior(p, torch.tensor([0, 8]), torch.tensor([0.5, 0.5])),
                               torch.tensor([[1 / 7, 6 / 7]]))


def test_the_teacher_shifted_to_the_clients_prior_is_scored_beside_the_teacher():
    public = torch.zeros(6, 1, 2, 2, dtype=torch.uint8)  # black: the teacher is even on U
    x = torch.full((4, 1, 2, 2), 255, dtype=torch.uint8)  # white: the teacher says 0.6 / 0.4
    y = torch.tensor([1, 1, 1, 0])  # this client's test labels: mostly class 1, as its training labels
    teacher = _Fixed()
    out = evaluate_models({"client": _Fixed(), "teacher": teacher}, x, y, 2, CPU, class_counts=torch.tensor([0, 8]),
                          public=public)
    assert out["teacher"]["top1"] == 0.25  # argmax 0 everywhere: only the last label is right
    assert out["teacher_prior"]["top1"] == 0.75  # shifted to 1/7, 6/7: argmax 1, three of four right
    assert set(out) == {"client", "teacher", "teacher_prior"}
    # without the client's counts (or without a teacher) nothing extra is scored; an empty split is undefined
    assert set(evaluate_models({"teacher": teacher}, x, y, 2, CPU)) == {"teacher"}
    empty = evaluate_models({"teacher": teacher}, x[:0], y[:0], 2, CPU, class_counts=torch.tensor([0, 8]),
                            public=public)
    assert math.isnan(empty["teacher_prior"]["top1"])
