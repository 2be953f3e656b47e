"""KL batchmean, temperature and r_B against hand-computed values (COSMOS paper, Eq. 1-2, Appendix C)."""

import math

import pytest
import torch

from cosmos_pl.losses import apply_temperature
from cosmos_pl.objectives.distill import distillation_loss


def test_kl_batchmean_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # q = [.5,.5] and [.75,.25]
    targets = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    # KL(p||q): log 2 = 0.693147 ; .5 log(.5/.75) + .5 log(.5/.25) = 0.143841 ; batchmean = 0.418494
    total, kl, reg = distillation_loss(logits, targets)
    assert kl.item() == pytest.approx(0.418494, abs=1e-6)
    assert total.item() == pytest.approx(0.418494, abs=1e-6) and reg.item() == 0
    # matches torch's own KLDivLoss(batchmean), the paper's loss
    ref = torch.nn.KLDivLoss(reduction="batchmean")(torch.log_softmax(logits, 1), targets)
    assert kl.item() == pytest.approx(ref.item(), abs=1e-7)


def test_per_sample_weights_scale_each_sample():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    targets = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    _, kl, _ = distillation_loss(logits, targets, weights=torch.tensor([2.0, 0.0]))
    assert kl.item() == pytest.approx(2 * math.log(2) / 2, abs=1e-6)


def test_consistency_term_by_hand_and_lambda_scaling():
    clean = torch.tensor([[0.0, 0.0]])  # g(x) = [.5,.5]
    view = torch.tensor([[math.log(3.0), 0.0]])  # g(x') = [.75,.25]
    targets = torch.tensor([[0.5, 0.5]])
    total, kl, reg = distillation_loss(clean, targets, view, lam=5.0)
    # r_B = KL(g(x) || g(x')) = .5 log(.5/.75) + .5 log(.5/.25) = 0.143841
    assert reg.item() == pytest.approx(0.143841, abs=1e-6)
    assert kl.item() == pytest.approx(0.0, abs=1e-7)
    assert total.item() == pytest.approx(5 * 0.143841, abs=1e-5)


def _reg_grads(target_grad):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4)
    x_view = x + 0.3 * torch.randn(8, 4)
    logits, view_logits = layer(x), layer(x_view)
    targets = torch.softmax(logits, 1).detach()
    _, _, reg = distillation_loss(logits, targets, view_logits, lam=1.0, target_grad=target_grad)
    reg.backward()
    return reg.item(), layer.weight.grad.clone(), logits, view_logits


@pytest.mark.parametrize("target_grad", [False, True])
def test_consistency_term_carries_gradient(target_grad):
    # r_B must send gradient to the parameters (a regularizer computed without gradient would change nothing), with
    # either setting of the switch
    reg, grad, _, _ = _reg_grads(target_grad)
    assert reg > 0
    assert grad.abs().sum().item() > 1e-6


def test_target_grad_switch_changes_only_the_gradient():
    reg_fixed, grad_fixed, _, _ = _reg_grads(False)
    reg_both, grad_both, _, _ = _reg_grads(True)
    assert reg_fixed == pytest.approx(reg_both)  # same value ...
    assert not torch.allclose(grad_fixed, grad_both)  # ... different gradient path


def test_temperature():
    p = torch.tensor([[0.8, 0.2]])
    assert torch.equal(apply_temperature(p, 1.0), p)
    # T=0.5: p^2 / sum = [.64, .04] / .68
    assert apply_temperature(p, 0.5)[0].tolist() == pytest.approx([0.941176, 0.058824], abs=1e-5)
    assert apply_temperature(p, 0.0).tolist() == [[1.0, 0.0]]  # hard labels
    # T=2: sqrt(p) / sum = [.894427, .447214] / 1.341641
    assert apply_temperature(p, 2.0)[0].tolist() == pytest.approx([0.666667, 0.333333], abs=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(p, -1.0)


def test_adjust_to_prior_hand_worked():
    from cosmos_pl.losses import adjust_to_prior

    probs = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    # pi_U = mean over rows = (0.7, 0.3); counts (2, 0) -> +1 -> (3, 1)/4 = (0.75, 0.25)
    # row 1: 0.5 * 0.75/0.7 = 0.535714, 0.5 * 0.25/0.3 = 0.416667 -> / 0.952381 -> (0.5625, 0.4375)
    # row 2: 0.9 * 0.75/0.7 = 0.964286, 0.1 * 0.25/0.3 = 0.083333 -> / 1.047619 -> (0.920455, 0.079545)
    out = adjust_to_prior(probs, torch.tensor([2, 0]))
    assert torch.allclose(out, torch.tensor([[0.5625, 0.4375], [0.920455, 0.079545]]), atol=1e-5)
    # a client whose prior equals the pseudo-labels' own prior leaves them unchanged
    same = adjust_to_prior(torch.tensor([[0.6, 0.4], [0.2, 0.8]]), torch.tensor([3, 5]))  # (4, 6)/10 = (0.4, 0.6)
    assert torch.allclose(same, torch.tensor([[0.6, 0.4], [0.2, 0.8]]), atol=1e-6)
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        adjust_to_prior(probs, torch.tensor([1, 2, 3]))
