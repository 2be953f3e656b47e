"""The worked example (docs/extending.md) of a new objective (FedProx) runs as written, and at ``mu = 0`` its round ends on
FedAvg's weights bit for bit: the proximal term then adds exactly nothing to the gradient, and the step is seeded as
FedAvg's local training is."""

from __future__ import annotations

import functools
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from cosmos_pl.algorithms import FedAvg
from cosmos_pl.data import Digits, Federation, GroupDirichlet, build_federation
from cosmos_pl.execution.executor import ExecutorConfig
from cosmos_pl.federated.runner import Runner, RunSettings
from cosmos_pl.objectives.wire import steps_from_wire, steps_to_wire
from cosmos_pl.training.client import ClientConfig
from cosmos_pl.training.config import TrainerConfig

README = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture(scope="module")
def digits_federation() -> Federation:
    """Three clients of scikit-learn's digits, 150 training images each at most."""
    return build_federation(Digits().load(), GroupDirichlet(num_groups=3), 3, seed=0, public_fraction=0.1,
                            test_samples_per_client=20, max_train_samples=450)


def _example() -> types.ModuleType:
    """The python block after README's ``<!-- example: a new objective -->`` marker, as a module."""
    text = README.read_text()
    block = re.search(r"<!-- example: a new objective -->\n```python\n(.*?)```", text, re.S)
    assert block, "README lost its worked example of a new objective"
    module = types.ModuleType("readme_fedprox")
    sys.modules[module.__name__] = module  # dataclasses resolve their module by name
    exec(compile(block.group(1), str(README), "exec"), module.__dict__)
    return module


def _round(algorithm, federation: Federation) -> list[dict[str, torch.Tensor]]:
    adam = functools.partial(torch.optim.Adam, lr=1e-3)
    clients = ClientConfig(backbones=["test_efficientnet"], pretrain_epochs=1, local_epochs=1, batch_size=32,
                           optimizer=adam, distill_optimizer=adam)
    runner = Runner(federation, algorithm, clients, RunSettings(
        rounds=1, seed=0, trainer=TrainerConfig(accelerator="cpu"),
        executor=ExecutorConfig(kind="sequential", threads_per_worker=1)))
    runner.pretrain()
    runner.train_round(1)
    return [runner.clients.clients[i].model.state_dict() for i in range(len(runner.clients.infos))]


def test_the_readme_objective_at_mu_0_ends_on_fedavgs_weights(digits_federation):
    example = _example()
    prox = _round(example.FedProx(mu=0.0), digits_federation)
    plain = _round(FedAvg(), digits_federation)
    for a, b in zip(prox, plain):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    # with mu > 0 the proximal term does act: the round ends elsewhere
    pulled = _round(example.FedProx(mu=1.0), digits_federation)
    assert any(not torch.equal(pulled[0][k], plain[0][k]) for k in plain[0] if plain[0][k].is_floating_point())


def test_the_readme_objective_travels_by_its_own_wire_encoding():
    example = _example()
    step = example.FedProxFit(2, 0.5)
    config, arrays = steps_to_wire([(step, None)])
    assert config == {"steps": 1, "s0.step": "FedProxFit", "s0.step.epochs": 2, "s0.step.mu": 0.5} and arrays == {}
    assert steps_from_wire(config, arrays) == [(step, None)]
