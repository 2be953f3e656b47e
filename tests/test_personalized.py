"""Ditto and FedBABU: the client holding a personal model and a copy of the global model, worked out by hand.

Ditto's personal step (Li et al., 2021, Algorithm 1): one SGD step moves v by ``-lr * (grad CE(v) + lam (v - w))``.
FedBABU (Oh et al., 2022): the head is frozen and never sent, the bodies are averaged by sample count, the
personal model is the global one fine-tuned.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cosmos_pl.algorithms import ALGORITHMS, Ditto, FedBABU, algorithm_class
from cosmos_pl.algorithms.fedavg import weighted_average
from cosmos_pl.errors import ConfigError
from cosmos_pl.models.personal import PersonalAndGlobal, head_name, load_shared_weights, shared_weights
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.objectives.finetune import FineTune, fine_tune
from cosmos_pl.objectives.local_fit import LocalFit, fit_supervised
from cosmos_pl.objectives.protocol import StartGlobal, start_global
from cosmos_pl.objectives.proximal import ProxFit, fit_proximal
from cosmos_pl.transforms import prepare


def _linear(seed: int = 0) -> nn.Module:
    """[B, 1, 2, 2] -> logits [B, 3]: a flatten and one linear layer (its classifier head is ``1``)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def _conv_pair(seed: int, where: str) -> PersonalAndGlobal:
    """FedBABU's client of a conv body and a linear head ``2``, with 1.0 added to the parameters of ``where``
    (``"personal"`` or ``"shared"``) so that its two models differ."""
    torch.manual_seed(seed)
    pair = PersonalAndGlobal(nn.Sequential(nn.Conv2d(1, 2, 1), nn.Flatten(), nn.Linear(8, 3)), share_head=False)
    with torch.no_grad():
        for p in getattr(pair, where).parameters():
            p.add_(1.0)
    return pair


def _sgd(lr: float):
    return lambda params: torch.optim.SGD(params, lr=lr)


CPU = TrainerConfig(accelerator="cpu")
X = torch.tensor([[[[0, 255], [128, 64]]], [[[255, 255], [0, 32]]]], dtype=torch.uint8)  # [2, 1, 2, 2]
Y = torch.tensor([2, 0])


def _one_step(fn, model, **kwargs):
    # batch 2 = the whole set: one epoch is one SGD step
    return fn(model, X, Y, epochs=1, batch_size=2, transformations=None, trainer=CPU, seed=0, **kwargs)


def test_ditto_personal_step_is_sgd_on_cross_entropy_plus_the_proximal_pull():
    lam, lr = 0.5, 0.1
    pair = PersonalAndGlobal(_linear(0))
    with torch.no_grad():  # w differs from v
        for p in pair.shared.parameters():
            p.add_(0.3)
    v_w, v_b = (t.detach().clone() for t in pair.personal[1].parameters())
    w_w, w_b = (t.detach().clone() for t in pair.shared[1].parameters())
    # by hand: softmax cross-entropy's gradient (p - onehot(y)) x^T / B, plus lam (v - w)
    x = prepare(X).flatten(1)  # the model's input, [2, 4]
    probs = torch.softmax(x @ v_w.T + v_b, dim=1)
    err = (probs - nn.functional.one_hot(Y, 3).float()) / 2
    expected_w = v_w - lr * (err.T @ x + lam * (v_w - w_w))
    expected_b = v_b - lr * (err.sum(0) + lam * (v_b - w_b))
    parts = _one_step(fit_proximal, pair, lam=lam, optimizer=_sgd(lr))
    torch.testing.assert_close(pair.personal[1].weight, expected_w)
    torch.testing.assert_close(pair.personal[1].bias, expected_b)
    # w is read, never trained; the loss parts are CE and lam / 2 ||v - w||^2 = lam / 2 * 15 * 0.3^2 at the
    # start (12 weights and 3 biases, each 0.3 apart)
    assert torch.equal(pair.shared[1].weight, w_w) and torch.equal(pair.shared[1].bias, w_b)
    assert parts[0]["prox"] == pytest.approx(lam / 2 * 15 * 0.09, rel=1e-5)


def test_ditto_with_lambda_zero_is_plain_cross_entropy_and_the_global_update_leaves_the_personal_model():
    a, b = PersonalAndGlobal(_linear(0)), _linear(0)
    with torch.no_grad():
        for p in a.shared.parameters():
            p.mul_(-2.0)
    _one_step(fit_proximal, a, lam=0.0, optimizer=_sgd(0.1))
    _one_step(fit_supervised, b, optimizer=_sgd(0.1))
    for p, q in zip(a.personal.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)
    personal = [p.detach().clone() for p in a.personal.parameters()]
    _one_step(fit_supervised, a, optimizer=_sgd(0.1), part="shared")  # the global copy's update
    assert all(torch.equal(p, q) for p, q in zip(a.personal.parameters(), personal))


def test_fedbabu_head_is_frozen_kept_home_and_bodies_are_averaged_by_sample_count():
    assert PersonalAndGlobal(_linear(0), share_head=False).head == "1" and head_name(_linear()) == "1"
    # a model with a body: conv (body) + linear (head)
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.Flatten(), nn.Linear(8, 3))
    pairs = [PersonalAndGlobal(net, share_head=False), PersonalAndGlobal(net, share_head=False)]
    sent = [shared_weights(p) for p in pairs]
    assert sorted(sent[0]) == ["shared.0.bias", "shared.0.weight"]  # the head "2" stays home
    with torch.no_grad():
        sent[0]["shared.0.weight"].fill_(1.0)
        sent[1]["shared.0.weight"].fill_(5.0)
    average = weighted_average({0: sent[0], 1: sent[1]}, {0: 1, 1: 3})  # (1 * 1 + 3 * 5) / 4 = 4
    assert torch.equal(average["shared.0.weight"], torch.full((2, 1, 1, 1), 4.0))
    head = pairs[0].shared[2].weight.detach().clone()
    pairs[0].load_state_dict(average, strict=False)
    assert torch.equal(pairs[0].shared[0].weight, torch.full((2, 1, 1, 1), 4.0))
    assert torch.equal(pairs[0].shared[2].weight, head)
    # training the global copy leaves its frozen head at the initialization and moves the body
    body = pairs[1].shared[0].weight.detach().clone()
    _one_step(fit_supervised, pairs[1], optimizer=_sgd(0.5), part="shared")
    assert torch.equal(pairs[1].shared[2].weight, head) and not torch.equal(pairs[1].shared[0].weight, body)


def test_fedbabu_fine_tune_starts_from_the_global_model_and_trains_the_head_too():
    pair = _conv_pair(2, "shared")
    fine_tune(pair, X, Y, epochs=0, batch_size=2, transformations=None, trainer=CPU, seed=0, optimizer=_sgd(0.1))
    assert all(torch.equal(p, q) for p, q in zip(pair.personal.parameters(), pair.shared.parameters()))
    head = pair.personal[2].weight.detach().clone()
    fine_tune(pair, X, Y, epochs=1, batch_size=2, transformations=None, trainer=CPU, seed=0, optimizer=_sgd(0.1))
    assert not torch.equal(pair.personal[2].weight, head)  # the personal head is trained
    assert torch.equal(pair.shared[2].weight, head)  # the global one is not


def test_start_global_copies_the_round0_model_without_the_head_for_fedbabu():
    pair = _conv_pair(3, "personal")
    head = pair.shared[2].weight.detach().clone()
    start_global(pair, with_head=False)
    assert torch.equal(pair.shared[0].weight, pair.personal[0].weight)
    assert torch.equal(pair.shared[2].weight, head)
    assert int(pair.global_started) == 1
    with torch.no_grad():
        pair.personal[0].weight.add_(1.0)
    start_global(pair, with_head=False)  # it holds a global model now: a later round leaves it
    assert not torch.equal(pair.shared[0].weight, pair.personal[0].weight)
    # a client that first receives the server's average (not sampled, or failed, in its first round) keeps it
    fresh = PersonalAndGlobal(nn.Sequential(nn.Conv2d(1, 2, 1), nn.Flatten(), nn.Linear(8, 3)))
    average = {k: torch.full_like(v, 0.25) for k, v in shared_weights(fresh).items()}
    load_shared_weights(fresh, average)
    start_global(fresh, with_head=True)
    assert torch.equal(fresh.shared[2].weight, torch.full((3, 8), 0.25))
    with pytest.raises(RuntimeError, match="keyed shared"):
        fresh.load_global({"personal.0.weight": torch.zeros(2, 1, 1, 1)})


def test_a_fine_tune_of_zero_epochs_still_runs_and_zero_epoch_training_is_skipped():
    assert not FineTune(0).idle() and LocalFit(0).idle() and ProxFit(0, 0.1).idle() and not StartGlobal().idle()


def test_ditto_and_fedbabu_are_homogeneous_and_their_settings_are_checked():
    assert algorithm_class("ditto") is Ditto and ALGORITHMS["fedbabu"] is FedBABU
    for cls in (Ditto, FedBABU):
        with pytest.raises(ConfigError, match="every client needs the same backbone"):
            cls().validate(["lcnet_050", "test_efficientnet"])
    with pytest.raises(ConfigError, match=r"algorithm.init_args.lambda_=-1"):
        Ditto(lambda_=-1)
    with pytest.raises(ConfigError, match=r"algorithm.init_args.finetune_epochs=-1"):
        FedBABU(finetune_epochs=-1)
    ditto_sends = shared_weights(Ditto().client_model(_linear()))
    assert sorted(ditto_sends) == ["shared.1.bias", "shared.1.weight"]  # the global model, head included
    assert shared_weights(FedBABU().client_model(_linear())) == {}  # a linear model is all head


def _rows(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # small digits runs: the round loop with a client holding two models, over the checkpoint
def test_fedbabu_run_holds_one_global_body_a_fixed_head_and_sends_the_body_alone(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    run, cache = tmp_path / "fedbabu", tmp_path / "round0"

    def fit(algorithm, run_dir, rounds, *extra):
        return main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithm", algorithm,
                     "--clients.backbones", "[test_efficientnet]", "--rounds", str(rounds), "--data.num_clients", "5",
                     "--clients.pretrain_epochs", "1", "--executor.threads_per_worker", "1", "--wandb.mode",
                     "disabled", "--run_dir", str(run_dir), *extra])

    assert fit("FedBABU", run, 2, "--round0_cache", str(cache)) == 0
    rounds = [torch.load(run / "checkpoints" / f"round-000{r}.pt", weights_only=True)["clients"]["models"]
              for r in (1, 2)]
    models = rounds[1]
    head = [k for k in models[0] if k.startswith("shared.classifier.")]
    assert head == ["shared.classifier.weight", "shared.classifier.bias"]
    for key, value in models[0].items():
        if key.startswith("shared.") and value.is_floating_point():  # one global model, held by every client
            assert all(torch.equal(m[key], value) for m in models[1:]), key
    for key in head:  # the head stays where the shared initialization put it
        assert torch.equal(rounds[0][0][key], models[0][key])
    for m in models:  # the scored personal model is the global one fine-tuned: the head moved
        assert not torch.equal(m["personal.classifier.weight"], m["shared.classifier.weight"])
    body_bytes = sum(v.numel() * v.element_size() for k, v in models[0].items()
                     if k.startswith("shared.") and v.is_floating_point() and k not in head)
    metrics = _rows(run / "metrics.csv")
    assert [int(r["upload_bytes_per_client"]) for r in metrics] == [0, body_bytes, body_bytes]
    assert [int(r["download_bytes_per_client"]) for r in metrics] == [0, body_bytes, body_bytes]
    assert all(r["fine-tuning_loss"] for r in metrics[1:])
    # round 0 trains the personal model alone, so one cached round 0 serves both: FedAvg on FedBABU's gets the
    # numbers FedAvg gets training its own, and FedBABU on FedAvg's (its global copy then starts in round 1 from
    # the loaded model) the numbers of the run above
    capsys.readouterr()
    assert fit("FedAvg", tmp_path / "fedavg_cached", 1, "--round0_cache", str(cache)) == 0
    out = capsys.readouterr().out
    # the run's first line names the device it trains on (digits_smoke: trainer.accelerator cpu, 32-true)
    from cosmos_pl.execution.devices import available_cpus

    cores = available_cpus()
    assert out.splitlines()[0] == (f"device: CPU ({cores} core{'s' if cores != 1 else ''}; torch "
                                   f"{torch.__version__}), precision 32-true")
    assert "round 0: client models loaded from" in " ".join(out.split())
    assert fit("FedAvg", tmp_path / "fedavg", 1, "--round0_cache", str(tmp_path / "fedavg_round0")) == 0
    assert "round 0: client models loaded from" not in " ".join(capsys.readouterr().out.split())
    assert _rows(tmp_path / "fedavg_cached" / "metrics.csv") == _rows(tmp_path / "fedavg" / "metrics.csv")
    assert _rows(tmp_path / "fedavg" / "metrics.csv")[0]["client_acc_mean"] == metrics[0]["client_acc_mean"]
    assert fit("FedBABU", tmp_path / "fedbabu_cached", 2, "--round0_cache", str(tmp_path / "fedavg_round0")) == 0
    assert "round 0: client models loaded from" in " ".join(capsys.readouterr().out.split())
    assert _rows(tmp_path / "fedbabu_cached" / "metrics.csv") == metrics
