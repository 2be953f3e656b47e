"""pFedCK (Zhang and Shi, Electronics 2024): the cluster update, the clients' mutual-distillation losses, the
interactive model's delta upload, and the algorithm's checkpoint. Worked values are
recomputed by hand in each test's comments."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from cosmos_pl.algorithms import PFedCK
from cosmos_pl.algorithms.base import FederationContext
from cosmos_pl.errors import ConfigError
from cosmos_pl.models.features import features_and_logits
from cosmos_pl.models.interactive import PersonalAndInteractive
from cosmos_pl.models.personal import PersonalAndGlobal, load_shared_weights, personal_model, shared_weights
from cosmos_pl.objectives.mutual import MutualFit, mutual_losses
from cosmos_pl.objectives.protocol import LoadWeights, Upload


def _ctx(n_clients, sizes=None):
    return FederationContext(
        num_clients=n_clients, num_classes=2, public=torch.zeros(0, 1, 4, 4, dtype=torch.uint8),
        backbones=["a"] * n_clients, client_sizes=sizes or [1] * n_clients, seed=0,
        stage_seed=lambda rnd, stage, i: 1000 * rnd + i, make_backbone=lambda name, seed: nn.Linear(1, 1),
        run_tasks=None, trainer=None, transformations=None, local_epochs=2, distill_epochs=3, log=lambda *_: None)


class _Tiny(nn.Module):
    """omega = fc.weight ``[1, 2]``: a model whose whole float state is the two numbers of the worked example."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1, bias=False)

    def forward(self, x):
        return self.fc(x)


def _clients(start, after):
    """One PersonalAndInteractive per row of ``after``: omega at ``start`` when the server last set it, then trained
    to ``after[i]``."""
    models = []
    for row in after:
        model = PersonalAndInteractive(_Tiny())
        with torch.no_grad():
            model.shared.fc.weight.copy_(torch.tensor([start]))
            model.start.fc.weight.copy_(torch.tensor([start]))
            model.shared.fc.weight.copy_(torch.tensor([row]))
        models.append(model)
    return models


def _round(models, algorithm):
    """Upload Delta omega, the server step, every client loads its target; returns omega per client ``[N, 2]``."""
    uploads = {i: shared_weights(m) for i, m in enumerate(models)}
    result = algorithm.server_step(1, uploads)
    for i, m in enumerate(models):
        load_shared_weights(m, result.targets[i])
    return torch.stack([m.shared.fc.weight.detach()[0] for m in models])


def test_the_cluster_mean_update_replaces_each_members_own():
    # Delta = [1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9] from omega0 = [0, 0], K = 2: clusters {0, 1} and {2, 3}
    # (cos(D0, D1) = 0.9 / sqrt(0.82) = 0.99388); means [0.95, 0.05] and [0.05, 0.95]. Counting the own update twice
    # (the COSMOS authors' add_ on the trained omega) would give client 0 [1 + 0.95, 0 + 0.05] = [1.95, 0.05].
    models = _clients([0.0, 0.0], [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    algorithm = PFedCK(num_clusters=2)
    algorithm.setup(_ctx(4))
    omega = _round(models, algorithm)
    expected = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.05, 0.95], [0.05, 0.95]])
    torch.testing.assert_close(omega, expected)
    assert algorithm.clustering_info()["clusters"] == [[0, 1], [2, 3]]
    assert [algorithm.cluster_of(i) for i in range(4)] == [0, 0, 1, 1]
    # the start moved with omega: the next upload is the next round's change alone
    assert all(float(v.abs().max()) == 0 for m in models for v in shared_weights(m).values())
    # one cluster's members now hold the same omega, bit for bit
    assert torch.equal(omega[0], omega[1]) and torch.equal(omega[2], omega[3])


def test_one_cluster_is_the_unweighted_mean_of_the_uploaded_interactive_models():
    # K = 1 with a common start: omega_new = start + mean(omega_i - start) = mean omega_i, whatever the clients'
    # sizes (the reference does not weight by |D_i|): start [0.5, -1]; omega [1, 2], [3, -2], [0.5, 0.5] ->
    # [(1 + 3 + 0.5) / 3, (2 - 2 + 0.5) / 3] = [1.5, 1/6]. Weighted by sizes 1, 2, 7 it would be [1.0, 0.35].
    after = [[1.0, 2.0], [3.0, -2.0], [0.5, 0.5]]
    models = _clients([0.5, -1.0], after)
    algorithm = PFedCK(num_clusters=1)
    algorithm.setup(_ctx(3, sizes=[1, 2, 7]))
    omega = _round(models, algorithm)
    torch.testing.assert_close(omega, torch.tensor([[1.5, 1 / 6]] * 3))


def test_a_client_that_changes_cluster_adds_its_new_clusters_mean_to_its_own_start_and_no_averaging_is_said():
    # round 1 from omega0 = [0, 0]: Delta [4, 0], [0, 4], [0, 4.2], [4.2, 0], K = 2 -> clusters {0, 3}, {1, 2}:
    # starts [4.1, 0] and [0, 4.1]. Round 2: Delta [0, 1], [0, 0.9], [1, 0], [0.9, 0] -> clusters {0, 1}, {2, 3}
    # (by the update, not the start): client 0 = [4.1, 0] + [0, 0.95] = [4.1, 0.95], client 1 = [0, 4.1] +
    # [0, 0.95] = [0, 5.05]: members of one cluster, different omega, as the docs say
    models = _clients([0.0, 0.0], [[4.0, 0.0], [0.0, 4.0], [0.0, 4.2], [4.2, 0.0]])
    lines = []
    algorithm = PFedCK(num_clusters=2)
    algorithm.setup(dataclasses.replace(_ctx(4), log=lines.append))
    torch.testing.assert_close(_round(models, algorithm), torch.tensor([[4.1, 0.0], [0.0, 4.1], [0.0, 4.1], [4.1, 0.0]]))
    for m, delta in zip(models, ([0.0, 1.0], [0.0, 0.9], [1.0, 0.0], [0.9, 0.0])):
        with torch.no_grad():
            m.shared.fc.weight.add_(torch.tensor([delta]))
    omega = _round(models, algorithm)
    assert algorithm.clustering_info()["clusters"] == [[0, 1], [2, 3]]
    torch.testing.assert_close(omega, torch.tensor([[4.1, 0.95], [0.0, 5.05], [0.95, 4.1], [5.05, 0.0]]))
    assert lines == []
    # as many uploads as clusters: every client is a cluster of its own, and the log says nothing is averaged
    algorithm.server_step(2, {i: shared_weights(m) for i, m in enumerate(models[:2])})
    assert lines == ["round 2: pFedCK: 2 clients uploaded, not more than num_clusters=2: each is a cluster of its own "
                     "this round, so no interactive model is averaged with another's"]


def test_the_client_losses_of_the_worked_example():
    # 2 classes, T = 2, a = b = 0.5, y = 0; phi logits [0, 0], omega logits [ln 3, 0]; h_phi [1, 2], h_omega [2, 0].
    # p_phi^T = [1/2, 1/2]; p_omega^T = softmax([ln 3 / 2, 0]) = [s / (1 + s), 1 / (1 + s)], s = sqrt(3):
    #   [0.633975, 0.366025]. CE(phi) = ln 2 = 0.693147; KL(p_omega^T || p_phi^T) = 0.036341, * T^2 = 0.145363;
    #   MSE = ((1-2)^2 + (2-0)^2) / 2 = 2.5; L_phi = 0.693147 + 0.5 * 0.145363 + 0.5 * 2.5 = 2.015829.
    # CE(omega) = -ln(3/4) = 0.287682; KL(p_phi^T || p_omega^T) = 0.037252, * T^2 = 0.149009;
    #   L_omega = 0.287682 + 0.5 * 0.149009 + 0.5 * 2.5 = 1.612187.
    s = math.sqrt(3)
    p = [s / (1 + s), 1 / (1 + s)]
    kl_omega_phi = sum(q * math.log(q / 0.5) for q in p)
    kl_phi_omega = sum(0.5 * math.log(0.5 / q) for q in p)
    assert 4 * kl_omega_phi == pytest.approx(0.145363, abs=1e-6) and 4 * kl_phi_omega == pytest.approx(0.149009,
                                                                                                        abs=1e-6)
    personal = (torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]]))
    interactive = (torch.tensor([[2.0, 0.0]]), torch.tensor([[math.log(3.0), 0.0]]))
    l_phi, l_omega = mutual_losses(personal, interactive, torch.tensor([0]), temperature=2.0, kl_weight=0.5,
                                   feature_weight=0.5)
    assert float(l_phi) == pytest.approx(2.015829, abs=1e-5)
    assert float(l_omega) == pytest.approx(1.612187, abs=1e-5)


def test_the_teacher_side_gets_no_gradient():
    # dL_phi/d omega = 0 and dL_omega/d phi = 0: each model's loss holds the other's outputs fixed
    torch.manual_seed(0)
    h_phi, z_phi, h_omega, z_omega = (torch.randn(3, 4, requires_grad=True) for _ in range(4))
    y = torch.tensor([0, 1, 3])
    l_phi, l_omega = mutual_losses((h_phi, z_phi), (h_omega, z_omega), y, temperature=2.0, kl_weight=0.5,
                                   feature_weight=0.5)
    grads = torch.autograd.grad(l_phi, [h_phi, z_phi, h_omega, z_omega], allow_unused=True)
    assert grads[0] is not None and grads[1] is not None and grads[2] is None and grads[3] is None
    grads = torch.autograd.grad(l_omega, [h_phi, z_phi, h_omega, z_omega], allow_unused=True)
    assert grads[0] is None and grads[1] is None and grads[2] is not None and grads[3] is not None


def test_the_personal_loss_reaches_no_interactive_parameter_of_a_real_backbone():
    from cosmos_pl.models.backbones import create_backbone

    torch.manual_seed(0)
    model = PersonalAndInteractive(create_backbone("test_efficientnet", 10, 1, 8))
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    l_phi, _ = mutual_losses(features_and_logits(model.personal, x), features_and_logits(model.shared, x), y,
                             temperature=2.0, kl_weight=0.5, feature_weight=0.5)
    grads = torch.autograd.grad(l_phi, list(model.shared.parameters()), allow_unused=True)
    assert all(g is None for g in grads)


def test_the_interactive_model_sends_its_change_and_starts_from_the_shared_initialization():
    torch.manual_seed(0)
    model = PersonalAndInteractive(_Tiny())
    assert isinstance(model, PersonalAndGlobal) and personal_model(model) is model.personal  # round 0 trains phi
    assert sorted(model.state_dict()) == ["global_started", "personal.fc.weight", "shared.fc.weight",
                                          "start.fc.weight"]
    assert [p is model.shared.fc.weight or p is model.personal.fc.weight for p in model.parameters()] == [True, True]
    torch.testing.assert_close(shared_weights(model)["shared.fc.weight"], torch.zeros(1, 2))
    with torch.no_grad():
        model.shared.fc.weight.add_(torch.tensor([[0.25, -0.5]]))
    torch.testing.assert_close(shared_weights(model)["shared.fc.weight"], torch.tensor([[0.25, -0.5]]))
    # the start rides in the state dict: a client restored from a checkpoint sends the same change
    copy = PersonalAndInteractive(_Tiny())
    copy.load_state_dict(model.state_dict())
    torch.testing.assert_close(shared_weights(copy), shared_weights(model))
    with pytest.raises(RuntimeError, match="every float entry of shared"):
        load_shared_weights(model, {"personal.fc.weight": torch.zeros(1, 2)})


def test_batchnorm_statistics_travel_and_counters_stay_home():
    model = PersonalAndInteractive(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)))
    assert sorted(shared_weights(model)) == ["shared.0.bias", "shared.0.weight", "shared.1.bias",
                                             "shared.1.running_mean", "shared.1.running_var", "shared.1.weight"]


def test_state_dict_round_trips_and_a_fresh_instance_behaves_the_same():
    after = [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]
    algorithm = PFedCK(num_clusters=2)
    algorithm.setup(_ctx(4))
    _round(_clients([0.0, 0.0], after), algorithm)
    restored = PFedCK(num_clusters=2)
    restored.setup(_ctx(4))
    restored.load_state_dict(torch.load(_saved(algorithm.state_dict()), weights_only=True))
    assert restored.clustering_info() == algorithm.clustering_info()
    assert [restored.cluster_of(i) for i in range(4)] == [algorithm.cluster_of(i) for i in range(4)]
    uploads = {i: {"shared.fc.weight": torch.tensor([row])} for i, row in enumerate(after[::-1])}
    one, two = algorithm.server_step(2, uploads), restored.server_step(2, uploads)
    assert one.targets.keys() == two.targets.keys() and one.download_bytes == two.download_bytes == 8
    assert all(torch.equal(one.targets[i]["shared.fc.weight"], two.targets[i]["shared.fc.weight"]) for i in range(4))
    assert restored.state_dict() == algorithm.state_dict()


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_plan_settings_and_errors():
    algorithm = PFedCK(temperature=3.0, kl_weight=1.0, feature_weight=0.0)
    algorithm.setup(_ctx(2))
    assert algorithm.plan(1) == [MutualFit(2, 3.0, 1.0, 0.0), Upload("weights"), LoadWeights()]
    assert PFedCK.shared_init and not PFedCK.uses_public and PFedCK.scored == "client"
    with pytest.raises(ConfigError, match=r"algorithm.init_args.temperature=0.0: must be finite and > 0"):
        PFedCK(temperature=0.0)
    with pytest.raises(ConfigError, match=r"algorithm.init_args.num_clusters=0: must be >= 1"):
        PFedCK(num_clusters=0)
    with pytest.raises(ConfigError, match=r"algorithm pFedCK averages parameters.*\['a', 'b'\]") as err:
        algorithm.validate(["a", "b", "a"])
    assert "\n" not in str(err.value)
    lines = []
    big = PFedCK(num_clusters=5)
    big.setup(FederationContext(**{**_ctx(3).__dict__, "log": lines.append}))
    assert "num_clusters=5 exceeds data.num_clients=3" in lines[0]


@pytest.mark.parametrize("name", ["test_efficientnet", "lcnet_035", "resnet18", "mobilenetv2_100", "alexnet",
                                  "squeezenet1_1"])
def test_pre_logits_features_of_the_configs_backbones(name):
    from cosmos_pl.models.backbones import create_backbone

    model = create_backbone(name, 10, 1, 8).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        h, z = features_and_logits(model, x)
        assert torch.equal(z, model(x))
    assert h.shape[0] == 2 and h.dim() == 2
    with pytest.raises(TypeError, match="no pre-logits features"):
        features_and_logits(nn.Linear(2, 2), torch.zeros(1, 2))


@pytest.mark.slow
def test_a_digits_fit_leaves_one_cluster_holding_one_interactive_model(repo_root, tmp_path):
    # 3 clients, K = 1, 2 rounds: after each round's load every omega_i equals the cluster's (start + mean Delta from
    # one start), its start equals it, and the personalized models, which never travel, still differ
    from cosmos_pl.cli import main

    run_dir = tmp_path / "run"
    assert main(["fit", "--config", str(repo_root / "configs" / "digits_flower.yaml"), "--algorithm", "pfedck",
                 "--algorithm.num_clusters", "1", "--data.num_clients", "3", "--clients.backbones",
                 "[test_efficientnet]", "--run_dir", str(run_dir)]) == 0
    models = torch.load(run_dir / "checkpoints" / "round-0002.pt", weights_only=True)["clients"]["models"]
    for key in (k for k in models[0] if k.startswith("shared.") and models[0][k].is_floating_point()):
        assert torch.equal(models[0][key], models[1][key]) and torch.equal(models[0][key], models[2][key])
        assert torch.equal(models[0][key], models[0]["start." + key[7:]])
    assert not torch.equal(models[0]["personal.conv_stem.weight"], models[1]["personal.conv_stem.weight"])
