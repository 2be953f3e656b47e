"""Divergence is never silent, and a backbone that cannot take the images fails before
any client trains.

Divergence: a non-finite training loss stops the stage at the first bad step; weights that become
non-finite, non-finite targets and non-finite predictions are errors; the upload decoder never turns NaN rows into
uniform rows. Every message is one line naming round, stage, client (or teacher) and the setting to lower.
Backbones: unknown names fail before the data is loaded, and each distinct backbone is dry-run on the
data's (C, H, W) before round 0.
"""

import math
import time
from functools import partial

import pytest
import torch
from torch import nn

from cosmos_pl.cli import run
from cosmos_pl.errors import ConfigError, DivergenceError, UserError
from cosmos_pl.federated.failures import RoundFailed
from cosmos_pl.objectives.distill import fit_distillation
from cosmos_pl.objectives.joint import fit_joint
from cosmos_pl.objectives.local_fit import fit_supervised
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.inference import evaluate, predict_probs
from cosmos_pl.training.module import default_optimizer
from cosmos_pl.transforms import Transformations

CPU = TrainerConfig(accelerator="cpu", channels_last=False)
WHERE = dict(where="round 2, local training, client 7", optimizer_key="clients.optimizer")


class _Counting(nn.Sequential):
    """A tiny CNN ``[B, 1, 8, 8] -> [B, M]`` that counts its forward passes."""

    def __init__(self, classes: int = 3) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(16, classes))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


def _data(n=64, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
    return x, torch.randint(0, classes, (n,), generator=g), torch.softmax(torch.randn(n, classes, generator=g), 1)


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg and isinstance(err.value, UserError)
    return msg


# ----------------------------------------------------------------------------------- training losses
def test_a_nonfinite_loss_stops_the_stage_at_the_first_bad_step():
    model = _Counting()
    x, y, _ = _data()  # 64 samples, batch 16: 4 steps per epoch
    with pytest.raises(DivergenceError) as err:
        fit_supervised(model, x, y, epochs=3, batch_size=16, optimizer=default_optimizer(1e37), transformations=None,
                       trainer=CPU, seed=0, **WHERE)
    msg = _one_line(err)
    # step 1 is finite; Adam's first update moves every weight by ~1e37, so step 2's loss overflows
    assert msg.startswith("round 2, local training, client 7: the training loss is nan at epoch 1 of 3, step 2 of 4")
    assert msg.endswith("training diverged; lower the learning rate clients.optimizer.init_args.lr (now 1e+37)")
    assert model.calls == 2  # stopped at that step, not after the 12 steps of training


def test_a_weight_decay_that_diverges_is_named_with_the_learning_rate():
    x, y, _ = _data()

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e38)

    with pytest.raises(DivergenceError) as err:
        fit_supervised(_Counting(), x, y, epochs=2, batch_size=16, optimizer=adamw, transformations=None,
                       trainer=CPU, seed=0, **WHERE)
    assert "clients.optimizer.init_args.lr (now 0.001) or the weight decay " \
           "clients.optimizer.init_args.weight_decay (now 1e+38)" in _one_line(err)


@pytest.mark.parametrize("stage", ["distillation", "joint"])
def test_a_distillation_and_joint_stages_check_their_losses(stage):
    x, y, targets = _data()
    common = dict(epochs=2, batch_size=16, optimizer=default_optimizer(1e37), trainer=CPU, seed=0,
                  where=f"round 1, {stage}, client 4", optimizer_key="clients.distill_optimizer")
    with pytest.raises(DivergenceError) as err:
        if stage == "distillation":
            fit_distillation(_Counting(), x, targets, transformations=Transformations(translate=1, noise_radius=0.1),
                             lam=5.0, num_views=1, **common)
        else:
            fit_joint(_Counting(), x, y, x, targets, transformations=None, lam=1.0, **common)
    msg = _one_line(err)
    parts = "(kl nan, r_b nan)" if stage == "distillation" else "(ce nan, kl nan)"
    assert msg.startswith(f"round 1, {stage}, client 4: the training loss is nan {parts} at epoch 1 of 2, step 2 of 4")
    assert "clients.distill_optimizer.init_args.lr (now 1e+37)" in msg


@pytest.mark.parametrize("stage", ["distillation", "joint"])
def test_a_a_huge_loss_weight_lambda_is_named_too(stage):
    x, y, targets = _data()
    common = dict(epochs=1, batch_size=16, optimizer=default_optimizer(1e-3), trainer=CPU, seed=0, lam=math.inf,
                  where="round 1, joint training, client 0", optimizer_key="clients.optimizer")
    with pytest.raises(DivergenceError) as err:
        if stage == "distillation":
            fit_distillation(_Counting(), x, targets, transformations=Transformations(translate=1), num_views=1,
                             **common)
        else:
            fit_joint(_Counting(), x, y, x, targets, transformations=None, **common)
    term = "r_B" if stage == "distillation" else "the distillation term"
    assert _one_line(err).endswith(f"at epoch 1 of 1, step 1 of 4: training diverged; lower the learning rate "
                                   f"clients.optimizer.init_args.lr (now 0.001), or lambda, the weight of {term} "
                                   f"(now inf)")


@pytest.mark.parametrize("stage", ["distillation", "joint"])
def test_b_nonfinite_targets_are_refused_before_training(stage):
    x, y, targets = _data()
    targets[5, 1] = float("nan")
    model = _Counting()
    common = dict(epochs=1, batch_size=16, optimizer=default_optimizer(1e-3), transformations=None, trainer=CPU,
                  seed=0, where="round 1, client distillation, client 2")
    with pytest.raises(DivergenceError) as err:
        if stage == "distillation":
            fit_distillation(model, x, targets, lam=0.0, num_views=1, **common)
        else:
            fit_joint(model, x, y, x, targets, lam=1.0, **common)
    assert _one_line(err).startswith("round 1, client distillation, client 2: the targets to train on are non-finite "
                                     "(nan) in 1 of 64 rows")
    assert model.calls == 0


def test_a_losses_checked_late_on_a_gpu_still_name_the_first_bad_step():
    """On a GPU the losses are checked every CHECK_EVERY steps; the message still names the first bad one."""
    from cosmos_pl.objectives.local_fit import SupervisedModule

    module = SupervisedModule(_Counting(), default_optimizer(1e-3), where="round 3, co-training, client 1",
                              optimizer_key="clients.optimizer")
    losses = [1.0, 2.0, 3.0, float("inf"), float("nan")]
    module._steps = {"loss": [torch.tensor(v) for v in losses]}
    module._checked = 2  # steps 1-2 were checked at an earlier check point
    with pytest.raises(DivergenceError, match=r"^round 3, co-training, client 1: the training loss is inf at epoch 1, "
                                              r"step 4: training diverged; lower the learning rate clients.optimizer"):
        module._check_losses()
    module._steps = {"loss": [torch.tensor(v) for v in losses[:3]]}
    module._check_losses()  # all finite: no error, and they count as checked
    assert module._checked == 3


# ----------------------------------------------------------------------------------- weights after a stage
def test_c_weights_that_become_nonfinite_in_the_last_step_are_an_error():
    x, y, _ = _data(n=16)  # one step: its loss is finite, the update it makes is not
    model = _Counting()
    with pytest.raises(DivergenceError) as err:
        fit_supervised(model, x, y, epochs=1, batch_size=16, optimizer=default_optimizer(math.inf),
                       transformations=None, trainer=CPU, seed=0, **WHERE)
    msg = _one_line(err)
    assert msg.startswith("round 2, local training, client 7: after 1 epoch(s) the model's weights are non-finite "
                          "(0.weight and 3 other tensors) although every training loss was finite")
    assert msg.endswith("clients.optimizer.init_args.lr (now inf)")
    assert model.calls == 1


# ----------------------------------------------------------------------------------- predictions
def test_b_predictions_of_a_model_with_nonfinite_weights_are_an_error():
    model = _Counting()
    with torch.no_grad():
        model[4].weight[0, 0] = float("nan")
    x, y, _ = _data(n=10)
    with pytest.raises(DivergenceError) as err:
        predict_probs(model, x, CPU, where="round 1, pseudo-labels on U, client 3")
    msg = _one_line(err)
    assert msg.startswith("round 1, pseudo-labels on U, client 3: the model's outputs are non-finite (nan) for 10 of "
                          "the inputs 0..9 (of 10); its weights are non-finite (4.weight): training diverged")
    with pytest.raises(DivergenceError, match=r"^round 0, evaluation \(test\), client 3"):
        evaluate(model, x, y, 3, CPU, where="round 0, evaluation (test), client 3")


def test_b_overflowing_predictions_of_finite_weights_are_an_error():
    model = _Counting()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e30)  # finite, but the activations overflow float32
    x, y, _ = _data(n=10)
    with pytest.raises(DivergenceError) as err:
        evaluate(model, x, y, 3, CPU, where="round 1, evaluation (test), client 0, teacher model")
    assert "its weights are finite but so large that the activations overflow" in _one_line(err)


def test_b_upload_codec_refuses_nonfinite_pseudo_labels_instead_of_making_them_uniform():
    from cosmos_pl.communication import Payload, decode, encode, encode_hard

    probs = torch.full((4, 5), 0.2)
    probs[2] = float("nan")
    for dtype in ("float32", "float16"):
        with pytest.raises(DivergenceError, match=r"non-finite \(nan\) in 1 of 4 rows"):
            encode(probs, dtype)
    with pytest.raises(DivergenceError, match="non-finite"):
        encode_hard(probs)
    for values in (probs, probs.half(), torch.full((4, 2), float("inf"))):
        indices = None if values.shape[1] == 5 else torch.zeros(4, 2, dtype=torch.uint8)
        with pytest.raises(DivergenceError, match="to decode"):
            decode(Payload(values, indices, 5, "float16" if values.dtype == torch.float16 else "float32"))
    # a finite row that quantizes to all zeros is still spread evenly (uint8 loses mass, nothing diverged)
    zeros = Payload(torch.zeros(1, 5, dtype=torch.uint8), None, 5, "uint8")
    assert decode(zeros).tolist() == [pytest.approx([0.2] * 5)]


def test_b_a_tiny_temperature_gives_one_hot_targets_not_nan():
    from cosmos_pl.losses import apply_temperature

    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    for t in (1e-40, 1e-30, 1e-8):
        out = apply_temperature(probs, t)
        assert torch.equal(out, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])), t
    assert torch.allclose(apply_temperature(probs, 2.0), torch.softmax(probs.log() / 2, dim=1))


# ----------------------------------------------------------------------------------- through the CLI
def _fit(repo_root, tmp_path, *flags):
    return run(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(tmp_path / "run"),
                "--wandb.mode", "disabled", "--rounds", "1", "--clients.pretrain_epochs", "1", *flags])


def test_cli_lr_1e37_fails_at_the_first_nonfinite_loss(repo_root, tmp_path):
    # each client's training stops at its first non-finite loss and fails the client, not the run; with every client
    # failed, round 0 is not committed and the run stops with the first reason, naming the setting
    start = time.perf_counter()
    with pytest.raises(RoundFailed) as err:
        _fit(repo_root, tmp_path, "--clients.optimizer.init_args.lr", "1e37")
    assert _one_line(err).endswith(
        "the first: client 0 in local training: DivergenceError: round 0, local training, client 0: the training "
        "loss is nan at epoch 1 of 1, step 2 of 4: training diverged; lower the learning rate "
        "clients.optimizer.init_args.lr (now 1e+37)")
    assert "round 0: only 0 of 10 clients finished it" in _one_line(err)
    assert not (tmp_path / "run" / "metrics.csv").exists()  # not even round 0's evaluation ran
    assert time.perf_counter() - start < 120  # seconds (about 3 on an idle 2-core CPU), not a whole training


@pytest.mark.parametrize("flag,expected", [
    # a teacher is the server's: its divergence stops the run at once
    ("--algorithm.init_args.teacher_optimizer.init_args.lr",
     r"^round 1, teacher distillation, teacher of cluster 0 \(clients \[0, 1, 2, 3, 4\]\): the training loss is "
     r"nan \(kl nan, r_b nan\) at epoch 1 of 1, step 2 of 2: .*algorithm.init_args.teacher_optimizer.init_args.lr "
     r"\(now 1e\+37\); rounds 0..0 are saved in .*/checkpoints: resume once fixed with `cosmos-pl fit --resume .*`$"),
    # clients' divergence fails them one by one; with none left the round stops
    ("--clients.distill_optimizer.init_args.lr",
     r"^round 1: only 0 of 5 clients finished it .* the first: client 0 in client distillation: DivergenceError: "
     r"round 1, client distillation, client 0: the training loss is nan \(kl nan, r_b nan\) at epoch 1 of 1, "
     r"step 2 of 9: .*clients.distill_optimizer.init_args.lr \(now 1e\+37\); rounds 0..0 are saved in "
     r".*/checkpoints: resume once fixed with .*$"),
])
def test_cli_huge_learning_rates_of_teacher_and_distillation_name_their_keys(repo_root, tmp_path, flag, expected):
    # no round-0 training, one cluster, one short teacher epoch: seconds. (An infinite rate is refused when the
    # config is parsed; 1e37 is finite and blows the weights up in the first step.)
    with pytest.raises(UserError) as err:
        _fit(repo_root, tmp_path, flag, "1e37", "--clients.pretrain_epochs", "0", "--data.num_clients", "5",
             "--algorithm.init_args.b0", "inf", "--algorithm.init_args.ptc_epochs", "1",
             "--algorithm.init_args.teacher_batch_size", "256")
    assert _one_line(err) and err.match(expected)


@pytest.mark.slow
def test_worker_process_divergence_comes_back_as_the_same_one_line_error():
    from cosmos_pl.execution.executor import Executor, ExecutorConfig

    x, y, _ = _data()
    task = (fit_supervised, dict(model=_Counting(), x=x, y=y, epochs=1, batch_size=16, transformations=None,
                                 optimizer=partial(torch.optim.Adam, lr=1e37), trainer=CPU, seed=0,
                                 where="round 0, local training, client 1", optimizer_key="clients.optimizer"))
    ex = Executor(ExecutorConfig(kind="parallel", devices=2, threads_per_worker=1), "cpu")
    assert ex.parallel
    try:
        with pytest.raises(DivergenceError) as err:  # the task runs in a spawned worker process
            list(ex.map([task], returns_model=True))
    finally:
        ex.close()
    assert _one_line(err) == ("round 0, local training, client 1: the training loss is nan at epoch 1 of 1, step 2 "
                              "of 4: training diverged; lower the learning rate clients.optimizer.init_args.lr "
                              "(now 1e+37)")


# ----------------------------------------------------------------------------------- backbones
def test_backbones_are_dry_run_on_the_data_shape_and_the_random_state_is_kept():
    from cosmos_pl.models import check_backbones

    state = torch.get_rng_state()
    check_backbones({"clients.backbones[0]": "test_efficientnet", "algorithm.init_args.teacher_backbone": "resnet10t"},
                    10, (1, 8, 8))
    with pytest.raises(ConfigError) as err:
        check_backbones({"clients.backbones[0]": "test_efficientnet", "clients.backbones[1]": "densenet121",
                         "clients.backbones[2]": "densenet121", "algorithm.init_args.teacher_backbone": "test_vit"},
                        10, (1, 8, 8))
    msg = _one_line(err)
    assert msg.startswith("clients.backbones[1] and clients.backbones[2]='densenet121' cannot take this data's images "
                          "of shape (C, H, W) = (1, 8, 8) with M = 10 classes: RuntimeError: Given input size: "
                          "(256x1x1). Calculated output size: (256x0x0). Output size is too small; "
                          "algorithm.init_args.teacher_backbone='test_vit' cannot take")
    assert "AssertionError: Input height (8) should be divisible by patch size (16). Choose another backbone" in msg
    assert "clients.backbones[0]" not in msg and "ImageFolderData" in msg
    assert torch.equal(torch.get_rng_state(), state)
    check_backbones({"clients.backbones[1]": "densenet121"}, 10, (3, 32, 32))  # fine on 32x32


@pytest.mark.parametrize("flags,key", [
    (["--clients.backbones", "[test_efficientnet, densenet121]"], "clients.backbones[1]='densenet121'"),
    (["--algorithm.init_args.teacher_backbone", "densenet121"], "algorithm.init_args.teacher_backbone='densenet121'"),
])
def test_cli_backbone_that_cannot_take_8x8_digits_fails_before_any_training(repo_root, tmp_path, monkeypatch,
                                                                           flags, key):
    from cosmos_pl.objectives import local_fit

    def no_training(*args, **kwargs):
        raise AssertionError("a client trained before the backbones were checked")

    monkeypatch.setattr(local_fit, "fit_supervised", no_training)
    with pytest.raises(ConfigError) as err:
        _fit(repo_root, tmp_path, *flags)
    msg = _one_line(err)
    assert msg.startswith(f"{key} cannot take this data's images of shape (C, H, W) = (1, 8, 8) with M = 10 classes: "
                          "RuntimeError: Given input size: (256x1x1)")


@pytest.mark.parametrize("flags,expected", [
    (["--clients.backbones", "[test_efficientnet, lcnet_35]"],
     "clients.backbones[1]='lcnet_35': unknown backbone. Did you mean one of: 'lcnet_035'"),
    (["--algorithm.init_args.teacher_backbone", "resnet18x"],
     "algorithm.init_args.teacher_backbone='resnet18x': unknown backbone. Did you mean one of: 'resnet18'"),
])
def test_cli_unknown_backbone_names_fail_before_the_data_is_loaded(repo_root, tmp_path, monkeypatch, flags, expected):
    from cosmos_pl.data import Digits

    def no_loading(self):
        raise AssertionError("the data was loaded before the backbone names were checked")

    monkeypatch.setattr(Digits, "load", no_loading)
    with pytest.raises(ConfigError) as err:
        _fit(repo_root, tmp_path, *flags)
    msg = _one_line(err)
    assert msg.startswith(expected) and "timm.list_models(" in msg
