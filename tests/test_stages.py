"""LightningModules and stages: lambda changes the trained weights (a regularizer must send gradient, not only add
to the loss's value), every switch is exercised both ways (a switch tested for truth would act the same either way),
errors are clear."""

import pytest
import torch
from torch import nn

from cosmos_pl.objectives.distill import DistillationModule, fit_distillation
from cosmos_pl.objectives.local_fit import fit_supervised
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.inference import evaluate, predict_probs
from cosmos_pl.training.module import default_optimizer
from cosmos_pl.transforms import Transformations

CPU = TrainerConfig(accelerator="cpu", channels_last=False)


def tiny_cnn(classes=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(16, classes))


def toy_images(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
    targets = torch.softmax(torch.randn(n, 3, generator=g), dim=1)
    return x, targets


def distilled_weights(lam):
    model = tiny_cnn()
    x, targets = toy_images()
    fit_distillation(model, x, targets, epochs=2, batch_size=16, optimizer=default_optimizer(1e-2),
                     transformations=Transformations(translate=1, noise_radius=0.1), lam=lam, num_views=1,
                     trainer=CPU, seed=7)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_lambda_changes_the_trained_weights():
    w0, w5 = distilled_weights(0.0), distilled_weights(5.0)
    assert not torch.allclose(w0, w5, atol=1e-6)
    assert torch.equal(distilled_weights(5.0), w5)  # and the run itself is deterministic


def test_supervised_training_learns_a_separable_problem():
    # class = which half of the image is bright: learnable in a few epochs
    n = 96
    y = torch.arange(n) % 2
    x = torch.zeros(n, 1, 8, 8, dtype=torch.uint8)
    x[y == 0, :, :, :4] = 255
    x[y == 1, :, :, 4:] = 255
    model = tiny_cnn(classes=2)
    before = evaluate(model, x, y, 2, CPU)["top1"]
    losses = fit_supervised(model, x, y, epochs=15, batch_size=16, optimizer=default_optimizer(1e-2),
                            transformations=None, trainer=CPU, seed=0)
    assert losses[-1]["loss"] < losses[0]["loss"]
    assert evaluate(model, x, y, 2, CPU)["top1"] == 1.0 and before < 1.0


@pytest.mark.parametrize("channels_last", [False, True])
def test_channels_last_switch_gives_the_same_predictions(channels_last):
    model = tiny_cnn()
    x, _ = toy_images(8)
    ref = predict_probs(model, x, CPU)
    out = predict_probs(model, x, TrainerConfig(accelerator="cpu", channels_last=channels_last))
    assert out.shape == (8, 3) and torch.allclose(out, ref, atol=1e-5)
    assert torch.allclose(out.sum(1), torch.ones(8), atol=1e-5)


@pytest.mark.parametrize("hflip", [False, True])
def test_hflip_switch(hflip):
    torch.manual_seed(0)
    x = torch.rand(64, 1, 4, 4)
    out = Transformations(translate=0, hflip=hflip, noise_radius=0).augment(x)
    flipped = [torch.equal(o, xi.flip(-1)) and not torch.equal(o, xi) for o, xi in zip(out, x)]
    assert any(flipped) == hflip
    assert all(torch.equal(o, xi) or torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x))


def test_distillation_module_rejects_bad_settings():
    with pytest.raises(ValueError, match="lambda_"):
        DistillationModule(tiny_cnn(), default_optimizer(1e-3), Transformations(), lam=-1.0)
    with pytest.raises(ValueError, match="num_views"):
        DistillationModule(tiny_cnn(), default_optimizer(1e-3), Transformations(), num_views=0)
    with pytest.raises(ValueError, match="transformations"):
        DistillationModule(tiny_cnn(), default_optimizer(1e-3), None, lam=1.0)


def test_gpu_accelerator_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="trainer.accelerator"):
        predict_probs(tiny_cnn(), toy_images(4)[0], TrainerConfig(accelerator="gpu"))


@pytest.mark.parametrize("compile_backbone", [False, True])
def test_compile_switch_trains_the_same_model_in_place(compile_backbone, monkeypatch):
    model = tiny_cnn()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    compiled = []
    real_compile = torch.compile

    def recording_compile(module, *args, **kwargs):
        compiled.append(module)
        return real_compile(module, *args, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)
    x, targets = toy_images(32)
    losses = fit_distillation(model, x, targets, epochs=1, batch_size=16, optimizer=default_optimizer(1e-2),
                              transformations=Transformations(translate=1), lam=1.0, num_views=1,
                              trainer=TrainerConfig(accelerator="cpu", channels_last=False, compile=compile_backbone),
                              seed=0)
    assert len(losses) == 1 and losses[0]["loss"] > 0
    # the total is KL + lambda * r_B (lambda 1 here)
    assert losses[0]["loss"] == pytest.approx(losses[0]["kl"] + losses[0]["r_b"], rel=1e-5)
    # compile wraps the caller's own model (once) and only when asked; training went through that wrapper into
    # the caller's parameter tensors, the same objects as before, each of them changed
    assert compiled == ([model] if compile_backbone else [])
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(not torch.equal(b, p) for b, p in zip(before, params))


def _bn_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten(), nn.Linear(16, 3))


@pytest.mark.parametrize("freeze_bn", [False, True])
def test_freeze_bn_keeps_running_statistics(freeze_bn):
    model = _bn_cnn()
    before = model[1].running_mean.clone()
    x, targets = toy_images(32)
    fit_distillation(model, x, targets, epochs=1, batch_size=16, optimizer=default_optimizer(1e-2),
                     transformations=None, lam=0.0, num_views=1, trainer=CPU, seed=0, freeze_bn=freeze_bn)
    assert torch.equal(model[1].running_mean, before) == freeze_bn
    assert model.training and model[1].training  # handed back in train mode either way


def _distilled(augment, transformations):
    model = tiny_cnn()
    x, targets = toy_images()
    fit_distillation(model, x, targets, epochs=1, batch_size=16, optimizer=default_optimizer(1e-2),
                     transformations=transformations, lam=0.0, num_views=1, trainer=CPU, seed=3, augment=augment)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_augment_switch_feeds_the_kl_term_transformed_inputs():
    t = Transformations(translate=2, noise_radius=0.0)
    plain = _distilled(False, None)
    # with lambda 0 the transformations are unused unless augment is on
    assert torch.equal(_distilled(False, t), plain)
    assert not torch.allclose(_distilled(True, t), plain, atol=1e-6)
