"""pFedHN (Shamsian et al., ICML 2021): the hypernetwork's gradient and step worked by hand, the client's delta sign,
stale uploads, the sequential and mean updates, the checkpointed state, the inner steps and the memory refusal."""

import io

import pytest
import torch
from torch import nn

from cosmos_pl.algorithms import ALGORITHMS, PFedHN
from cosmos_pl.algorithms.base import FederationContext
from cosmos_pl.algorithms.pfedhn import check_hypernet_memory, hypernet_bytes
from cosmos_pl.errors import ConfigError
from cosmos_pl.models.anchored import Anchored
from cosmos_pl.models.hypernet import HyperNetwork, auto_embed_dim, hypernet_size, hypernet_step
from cosmos_pl.models.personal import load_shared_weights, personal_model, shared_weights
from cosmos_pl.training.config import TrainerConfig


class LinearHN(nn.Module):
    """theta = W v_i + b (a worked example, by hand below): W = [[1, 0], [0, 1], [1, 1]], b = 0, v_0 = [1, 2], v_1 = [1, 0]."""

    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(2, 2)
        self.head = nn.Linear(2, 3)
        with torch.no_grad():
            self.embeddings.weight.copy_(torch.tensor([[1.0, 2.0], [1.0, 0.0]]))
            self.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
            self.head.bias.zero_()

    def forward(self, ids):
        return {"theta": self.head(self.embeddings(ids))}


def _close(tensor, expected):
    torch.testing.assert_close(tensor.detach(), torch.tensor(expected), rtol=0, atol=1e-6)


def test_one_step_on_a_linear_hypernetwork_moves_theta_toward_the_trained_weights():
    hn = LinearHN()
    theta = hn(torch.tensor([0]))["theta"][0].detach()
    _close(theta, [1.0, 2.0, 3.0])
    trained = torch.tensor([0.5, 2.0, 2.0])
    # delta = theta - theta~ = [0.5, 0, 1]: grad_W = delta v^T = [[0.5, 1], [0, 0], [1, 2]], grad_b = delta,
    # grad_v = W^T delta = [1.5, 1]; one SGD step at lr 0.1
    hypernet_step(hn, torch.optim.SGD(hn.parameters(), lr=0.1), {0: {"theta": theta - trained}}, clip=0)
    _close(hn.head.weight, [[0.95, -0.1], [0.0, 1.0], [0.9, 0.8]])
    _close(hn.head.bias, [-0.05, 0.0, -0.1])
    _close(hn.embeddings.weight[0], [0.85, 1.9])
    _close(hn.embeddings.weight[1], [1.0, 0.0])  # a client without an upload: no gradient, no weight decay here
    after = hn(torch.tensor([0]))["theta"][0].detach()
    _close(after, [0.5675, 1.9, 2.185])
    assert float((after - trained).norm()) == pytest.approx(0.2209, abs=1e-4)
    assert float((theta - trained).norm()) == pytest.approx(1.1180, abs=1e-4)


def test_sequential_and_mean_updates_on_two_clients():
    deltas = {0: {"theta": torch.tensor([0.5, 0.0, 1.0])}, 1: {"theta": torch.tensor([0.0, 0.0, 1.0])}}
    mean = LinearHN()
    hypernet_step(mean, torch.optim.SGD(mean.parameters(), lr=0.1), deltas, update="mean", clip=0)
    # one step on (J_0^T d_0 + J_1^T d_1) / 2 at the same phi
    _close(mean.head.weight, [[0.975, -0.05], [0.0, 1.0], [0.9, 0.9]])
    _close(mean.head.bias, [-0.025, 0.0, -0.1])
    _close(mean.embeddings.weight, [[0.925, 1.95], [0.95, -0.05]])
    seq = LinearHN()
    hypernet_step(seq, torch.optim.SGD(seq.parameters(), lr=0.1), deltas, update="sequential", clip=0)
    # client 0's step as above, then client 1's at the W it left: grad_v1 = W'^T d_1 = [0.9, 0.8]
    _close(seq.head.weight, [[0.95, -0.1], [0.0, 1.0], [0.8, 0.8]])
    _close(seq.head.bias, [-0.05, 0.0, -0.2])
    _close(seq.embeddings.weight, [[0.85, 1.9], [0.91, -0.08]])


def test_the_real_hypernetworks_heads_get_delta_times_features():
    torch.manual_seed(0)
    hn = HyperNetwork({"model.w": (2, 3), "model.b": (4,)}, num_clients=2, embed_dim=2, hidden_dim=5, hidden_layers=1)
    before = {k: v.clone() for k, v in hn.state_dict().items()}
    f = hn.features(torch.tensor([1]))[0].detach()
    delta = {"model.w": torch.arange(6.0).view(2, 3) / 10, "model.b": torch.tensor([1.0, -2.0, 0.5, 0.0])}
    hypernet_step(hn, torch.optim.SGD(hn.parameters(), lr=1.0), {1: delta}, clip=0)
    grad = {k: before[k] - v for k, v in hn.state_dict().items()}  # lr 1, no momentum: the step is the gradient
    torch.testing.assert_close(grad["heads.1.weight"], torch.outer(delta["model.b"], f))
    torch.testing.assert_close(grad["heads.1.bias"], delta["model.b"])
    torch.testing.assert_close(grad["heads.0.weight"], torch.outer(delta["model.w"].flatten(), f))
    assert torch.equal(grad["embeddings.weight"][0], torch.zeros(2))  # client 0 sent nothing
    assert not torch.equal(grad["embeddings.weight"][1], torch.zeros(2))  # the embedding learns (issue #5)


def test_hypernetwork_size_is_about_hidden_plus_one_times_the_target():
    shapes = {"a": (10, 3), "b": (10,)}
    hn = HyperNetwork(shapes, num_clients=7, embed_dim=auto_embed_dim(7, -1), hidden_dim=8, hidden_layers=2)
    assert auto_embed_dim(7, -1) == 2 and auto_embed_dim(50, -1) == 13 and auto_embed_dim(2, -1) == 1
    assert hypernet_size(shapes, 7, 2, 8, 2) == sum(p.numel() for p in hn.parameters()) == 7 * 2 + 3 * 8 + 2 * 9 * 8 \
        + 9 * 40
    # 4 copies of the hypernetwork and 3 + 1 generated thetas, float32, plus 10%: 1.1 * 4 * (400 + 40)
    assert hypernet_bytes(100, 10, 3) == 1936


def test_the_client_sends_what_it_was_sent_minus_what_it_trained():
    model = Anchored(nn.Linear(2, 1))
    assert float(model.generation) == -1.0
    sent = {"model.weight": torch.tensor([[1.0, 2.0]]), "model.bias": torch.tensor([3.0]),
            "generation": torch.tensor([4.0])}
    load_shared_weights(model, sent)
    with torch.no_grad():
        model.model.weight.copy_(torch.tensor([[0.5, 2.0]]))  # "trained" to theta~
        model.model.bias.copy_(torch.tensor([2.0]))
    up = shared_weights(model)
    assert set(up) == {"model.weight", "model.bias", "generation"}
    _close(up["model.weight"], [[0.5, 0.0]])  # theta - theta~
    _close(up["model.bias"], [1.0])
    _close(up["generation"], [4.0])
    assert personal_model(model) is model.model
    restored = Anchored(nn.Linear(2, 1))
    restored.load_state_dict(model.state_dict())  # start and generation ride in the model's state dict
    assert all(torch.equal(a, b) for a, b in zip(shared_weights(restored).values(), up.values()))


def _ctx(n=2, log=None):
    return FederationContext(
        num_clients=n, num_classes=2, public=torch.zeros(0, 1, 4, 4, dtype=torch.uint8), backbones=["a"] * n,
        client_sizes=[1] * n, seed=0, stage_seed=lambda rnd, stage, i: 1000 * rnd + i,
        make_backbone=lambda name, seed: nn.Linear(3, 2), run_tasks=None, trainer=TrainerConfig(accelerator="cpu"),
        transformations=None, log=log or (lambda *_: None))


def _uploads(algo, tag, n=2):
    torch.manual_seed(1)
    return {i: {"model.weight": torch.randn(2, 3), "model.bias": torch.randn(2), "generation": torch.tensor([tag])}
            for i in range(n)}


def _hn_state(algo):
    return {k: v.clone() for k, v in algo.hypernet.state_dict().items()}


def test_stale_uploads_leave_the_hypernetwork_bit_identical():
    lines = []
    algo = PFedHN(hidden_dim=4, hidden_layers=1)
    algo.setup(_ctx(log=lines.append))
    before = _hn_state(algo)
    result = algo.server_step(1, _uploads(algo, -1.0))  # round 1: round-0 models, generated by no hypernetwork
    assert all(torch.equal(before[k], v) for k, v in algo.hypernet.state_dict().items())
    assert algo.generation == 1 and float(result.targets[0]["generation"]) == 1.0
    assert result.download_bytes == 4 * 8 and algo.upload_bytes(0, _uploads(algo, 1.0)[0]) == 4 * 8
    ups = _uploads(algo, 0.0)  # tagged with a generation the server left behind
    algo.server_step(2, ups)
    assert all(torch.equal(before[k], v) for k, v in algo.hypernet.state_dict().items())
    assert any("skips the uploads of clients [0, 1]" in line for line in lines)
    algo.server_step(3, _uploads(algo, 2.0))  # current: the hypernetwork moves
    assert not all(torch.equal(before[k], v) for k, v in algo.hypernet.state_dict().items())


def test_the_generated_weights_load_into_the_client_and_match_the_reference():
    algo = PFedHN(hidden_dim=4, hidden_layers=1)
    algo.setup(_ctx())
    client = algo.client_model(nn.Linear(3, 2))
    targets = algo.server_step(1, _uploads(algo, -1.0)).targets
    load_shared_weights(client, targets[1])
    out = algo.hypernet(torch.arange(2))  # one batch for all clients, as generated
    assert torch.equal(client.model.weight, out["model.weight"][1].detach())
    up = shared_weights(client)
    assert {k: v.shape for k, v in up.items()} == {k: v.shape for k, v in shared_weights(
        algo.client_model(nn.Linear(3, 2))).items()}
    assert all(float(v.abs().sum()) == 0 for k, v in up.items() if k != "generation")


def test_state_dict_round_trips_through_weights_only():
    algo = PFedHN(hidden_dim=4, hidden_layers=1)
    algo.setup(_ctx())
    algo.server_step(1, _uploads(algo, -1.0))
    algo.server_step(2, _uploads(algo, 1.0))  # momentum buffers exist now
    buffer = io.BytesIO()
    torch.save(algo.state_dict(), buffer)
    buffer.seek(0)
    fresh = PFedHN(hidden_dim=4, hidden_layers=1)
    fresh.setup(_ctx())
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    a, b = algo.server_step(3, _uploads(algo, 2.0)), fresh.server_step(3, _uploads(fresh, 2.0))
    for i in range(2):
        assert all(torch.equal(a.targets[i][k], b.targets[i][k]) for k in a.targets[i])
    assert all(torch.equal(v, fresh.hypernet.state_dict()[k]) for k, v in algo.hypernet.state_dict().items())


def test_a_hypernetwork_too_large_for_its_device_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        check_hypernet_memory("resnet18", 11_200_000, 1_130_000_000, 14 * 2 ** 30, 8 * 2 ** 30, "cpu",
                              lambda: ("squeezenet1_1", 770_000), 100)
    text = str(err.value)
    assert "\n" not in text
    assert text == ("algorithm pfedhn: the hypernetwork for backbone resnet18 (|theta| = 11.20 M parameters) has "
                    "1.13 B parameters and needs about 14.0 GiB with its gradient, momentum and the generated "
                    "weights, and cpu has 8.0 GiB free: use a smaller backbone (clients.backbones: [squeezenet1_1], "
                    "|theta| = 0.77 M), or lower algorithm.init_args.hidden_dim (now 100)")
    check_hypernet_memory("x", 1, 1, 10, 10, "cpu", lambda: None, 100)  # fits: nothing
    check_hypernet_memory("x", 1, 1, 10, None, "cpu", lambda: None, 100)  # unknown: nothing


def test_setup_refuses_before_building(monkeypatch):
    from cosmos_pl.algorithms import pfedhn

    monkeypatch.setattr(pfedhn, "free_memory", lambda device: 1000)
    built = []
    monkeypatch.setattr(pfedhn, "HyperNetwork", lambda *args, **kwargs: built.append(args))
    with pytest.raises(ConfigError, match=r"lower algorithm.init_args.hidden_dim \(now 100\): no smaller backbone"):
        PFedHN().setup(_ctx())
    assert built == []  # refused before the hypernetwork is built


def test_settings_are_checked_and_the_plan_is_the_papers():
    from cosmos_pl.objectives.hn_inner import PFedHNFit
    from cosmos_pl.objectives.local_fit import LocalFit
    from cosmos_pl.objectives.protocol import LoadWeights, Upload

    assert ALGORITHMS["pfedhn"] is PFedHN
    for bad in (dict(update="median"), dict(inner_steps=-1), dict(embed_dim=0), dict(hn_lr=0.0), dict(clip=-1.0)):
        with pytest.raises(ConfigError, match=f"algorithm.init_args.{next(iter(bad))}="):
            PFedHN(**bad)
    with pytest.raises(ConfigError, match="same backbone"):
        PFedHN().validate(["a", "b"])
    algo = PFedHN(hidden_dim=4)
    algo.setup(_ctx())
    assert algo.plan(1) == [PFedHNFit(50, 5e-3, 0.9, 5e-5, 50.0), Upload("weights"), LoadWeights()]
    local = PFedHN(inner_steps=None, hidden_dim=4)
    local.setup(_ctx())
    assert local.plan(2)[0] == LocalFit(1)


def test_the_inner_loop_takes_exactly_its_steps_across_epochs():
    from cosmos_pl.objectives.hn_inner import fit_inner_steps

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.calls = 0

        def forward(self, x):
            self.calls += int(self.training)
            return self.fc(x.flatten(1))

    model = Counting()
    x, y = torch.randint(0, 255, (10, 1, 2, 2), dtype=torch.uint8), torch.randint(0, 2, (10,))
    start = model.fc.weight.detach().clone()
    fit_inner_steps(model, x, y, steps=7, lr=0.1, momentum=0.9, weight_decay=5e-5, clip=50.0, batch_size=4,
                    transformations=None, trainer=TrainerConfig(accelerator="cpu"), seed=0)
    assert model.calls == 7  # 3 batches per epoch: 2 epochs and 1 step
    assert not torch.equal(model.fc.weight, start)


@pytest.mark.slow  # about 22 s on one core
def test_a_short_fit_leaves_every_client_holding_what_the_checkpointed_hypernetwork_generates(repo_root, tmp_path):
    """digits, 3 clients, one backbone, 2 rounds: after round 2 each client's weights and ``start`` are exactly
    h(v_i; phi) of the checkpointed hypernetwork, tagged with its generation, and the bytes are |theta| x 4 each way."""
    import csv

    from cosmos_pl.cli import main

    run_dir = tmp_path / "run"
    assert main(["fit", "--config", str(repo_root / "configs/digits_flower.yaml"), "--algorithm", "pfedhn",
                 "--algorithm.inner_steps", "3", "--data.num_clients", "3", "--clients.backbones",
                 "[test_efficientnet]", "--clients.pretrain_epochs", "1", "--run_dir", str(run_dir)]) == 0
    state = torch.load(run_dir / "checkpoints" / "round-0002.pt", weights_only=True)
    algorithm, models = state["algorithm"], state["clients"]["models"]
    assert algorithm["generation"] == 2
    heads = {k: v for k, v in algorithm["hypernet"].items() if k.startswith("heads.")}
    theta = sum(v.shape[0] for k, v in heads.items() if k.endswith(".bias"))
    def start(key):  # the client's copy of a generated parameter, "model.a.b" -> "start.a/b"
        return "start." + key[len("model."):].replace(".", "/")

    names = [k for k in models[0] if k.startswith("model.") and start(k) in models[0]]  # parameters, not BN stats
    assert sum(models[0][k].numel() for k in names) == theta
    shapes = {k: tuple(models[0][k].shape) for k in names}
    hn = HyperNetwork(shapes, 3, auto_embed_dim(3, -1))
    hn.load_state_dict(algorithm["hypernet"])
    with torch.no_grad():
        out = hn(torch.arange(3))
    for i, weights in enumerate(models):
        assert float(weights["generation"]) == 2.0
        for k in names:
            assert torch.equal(weights[k], out[k][i]) and torch.equal(weights[start(k)], out[k][i]), (i, k)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["upload_bytes_per_client"], r["download_bytes_per_client"]) for r in rows[1:]] == \
        [(str(4 * theta), str(4 * theta))] * 2
