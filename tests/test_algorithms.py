"""Server steps of every algorithm on small hand-made uploads, worked out by hand; the name table."""

import pytest
import torch
from torch import nn

from cosmos_pl.algorithms import ALGORITHMS, COMET, COSMOS, FedAvg, FedCT, FedMD, LocalOnly, algorithm_class
from cosmos_pl.algorithms.base import FederationContext
from cosmos_pl.objectives.distill import Distill
from cosmos_pl.objectives.joint import JointFit
from cosmos_pl.objectives.local_fit import LocalFit
from cosmos_pl.objectives.protocol import LoadWeights, Upload
from cosmos_pl.objectives.union import UnionFit
from cosmos_pl.algorithms.comet import kmeans, kmeans_clusters
from cosmos_pl.algorithms.fedavg import weighted_average
from cosmos_pl.algorithms.fedct import majority_vote
from cosmos_pl.algorithms.fedmd import consensus_mean


@pytest.fixture(autouse=True)
def teachers_learn_their_target_exactly(monkeypatch):
    """COSMOS's real teacher stage runs (aggregation, temperature, fit, prediction); only the Lightning fit is
    replaced by a 'perfect' one: the teacher then predicts exactly the target it was trained on."""
    from cosmos_pl.objectives import distill
    from cosmos_pl.training import inference

    def fit_distillation(model, x, target, **kwargs):
        model.learned = target.clone()
        return [{"loss": 0.0}]

    monkeypatch.setattr(distill, "fit_distillation", fit_distillation)
    monkeypatch.setattr(inference, "predict_probs", lambda model, x, trainer, where="inference", **kwargs: model.learned)


def _ctx(n_clients, n=2, m=2, backbones=None, sizes=None, **kw):
    """A federation context without data: tasks run in this process, one after another."""
    def run_tasks(rnd, stage, tasks, costs=None, trains=False):
        return [(kwargs.get("model"), fn(**kwargs)) for fn, kwargs in tasks]

    return FederationContext(
        num_clients=n_clients, num_classes=m, public=torch.zeros(n, 1, 4, 4, dtype=torch.uint8),
        backbones=backbones or ["a"] * n_clients, client_sizes=sizes or [1] * n_clients, seed=0,
        stage_seed=lambda rnd, stage, i: 1000 * rnd + i, make_backbone=lambda name, seed: nn.Linear(1, 1),
        run_tasks=run_tasks, trainer=None, transformations=None, local_epochs=2, distill_epochs=3,
        log=lambda *_: None, **kw)


def test_fedmd_consensus_is_the_mean_of_the_uploads_received():
    uploads = {0: torch.tensor([[0.5, 0.5], [1.0, 0.0]]), 2: torch.tensor([[0.1, 0.9], [0.0, 1.0]])}
    torch.testing.assert_close(consensus_mean(uploads), torch.tensor([[0.3, 0.7], [0.5, 0.5]]))
    algo = FedMD()
    algo.setup(_ctx(3))
    result = algo.server_step(1, uploads)  # client 1 did not upload: it still gets the consensus
    assert sorted(result.targets) == [0, 1, 2]
    torch.testing.assert_close(result.targets[1], torch.tensor([[0.3, 0.7], [0.5, 0.5]]))
    assert result.download_bytes == 2 * 2 * 4
    assert algo.plan(1) == [Upload("soft"), Distill(3), LocalFit(2)]


def _one_hot(labels, m=3):
    return torch.nn.functional.one_hot(torch.tensor(labels), m).float()


def test_fedct_majority_vote_and_its_tie_rule():
    # 4 clients, 3 public samples; votes per sample: [0,0,1,2] -> 0; [2,2,1,2] -> 2; [2,1,2,1] tie 1/2 -> 1
    uploads = {i: _one_hot(col) for i, col in enumerate([[0, 2, 2], [0, 2, 1], [1, 1, 2], [2, 2, 1]])}
    torch.testing.assert_close(majority_vote(uploads), _one_hot([0, 2, 1]))
    algo = FedCT()
    algo.setup(_ctx(5, n=3, m=3))
    result = algo.server_step(1, uploads)
    assert sorted(result.targets) == [0, 1, 2, 3, 4]
    assert result.download_bytes == 3  # three class indices of one byte each
    assert algo.plan(1) == [Upload("hard"), UnionFit(2)]


def _separated(n_clients_per_group=2, n=5, m=3, noise=0.05, seed=0):
    """Soft labels of 3 groups: group g puts most mass on class g."""
    g = torch.Generator().manual_seed(seed)
    uploads = {}
    for i in range(3 * n_clients_per_group):
        group = i // n_clients_per_group
        p = torch.full((n, m), noise) + torch.rand(n, m, generator=g) * noise
        p[:, group] += 1.0
        uploads[i] = p / p.sum(1, keepdim=True)
    return uploads


def test_comet_kmeans_finds_well_separated_groups_and_sends_cluster_means():
    uploads = _separated()
    assert kmeans_clusters(uploads, 3, seed=0) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    algo = COMET(num_clusters=3, lambda_=0.5)
    algo.setup(_ctx(7, n=5, m=3))
    result = algo.server_step(1, uploads)  # client 6 did not upload: no cluster, no target
    assert sorted(result.targets) == [0, 1, 2, 3, 4, 5]
    torch.testing.assert_close(result.targets[2], (uploads[2] + uploads[3]) / 2)
    assert [algo.cluster_of(i) for i in range(7)] == [0, 0, 1, 1, 2, 2, None]
    assert algo.clustering_info()["clusters"] == [[0, 1], [2, 3], [4, 5]]
    assert algo.plan(1) == [Upload("soft"), JointFit(2, 0.5)]
    # fewer uploads than K: K shrinks to the number of uploads
    assert sorted(set(kmeans_clusters({0: uploads[0], 4: uploads[4]}, 3, seed=0).values())) == [0, 1]


def test_comet_sequential_mode_distills_on_u_then_fine_tunes_on_the_clients_data():
    algo = COMET(num_clusters=2, lambda_=0.5, mode="sequential")
    algo.setup(_ctx(4))  # local_epochs 2, distill_epochs 3
    assert algo.plan(1) == [Upload("soft"), Distill(3), LocalFit(2)]  # plain KL (lambda 0 on r_B), then CE
    five = COMET(num_clusters=2, mode="sequential", epochs=5)
    five.setup(_ctx(4))
    assert five.plan(2) == [Upload("soft"), Distill(3), LocalFit(5)]
    with pytest.raises(ValueError, match="mode"):
        COMET(mode="both")


def _points(*values):
    return {i: torch.tensor([[float(v)]]) for i, v in enumerate(values)}  # n = 1 public sample, M = 1


def test_comet_kmeans_warm_start_begins_from_the_given_centroids():
    # 1-D points 0, 2, 3, 5 and K = 2: the best split is {0, 2} | {3, 5} (squared error 2 + 2 = 4, against
    # 0 + 4.67 for {0} | {2, 3, 5}). Started from centroids 0 and 3.5, Lloyd's steps stop at {0} | {2, 3, 5}
    # (2 is 1.5 from 3.5 and 2 from 0; the centroids become 0 and 10/3, and 2 stays): the start was used.
    uploads = _points(0, 2, 3, 5)
    assert kmeans(uploads, 2, seed=0)[0] == {0: 0, 1: 0, 2: 1, 3: 1}
    found, centroids = kmeans(uploads, 2, seed=0, init=torch.tensor([[0.0], [3.5]]))
    assert found == {0: 0, 1: 1, 2: 1, 3: 1}
    torch.testing.assert_close(centroids, torch.tensor([[0.0], [10 / 3]], dtype=torch.float64))
    # a start of another K (or width) is not used: a fresh start
    assert kmeans(uploads, 2, seed=0, init=torch.tensor([[0.0], [3.5], [9.0]]))[0] == {0: 0, 1: 0, 2: 1, 3: 1}


def test_comet_warm_start_carries_the_centroids_from_round_to_round_and_through_a_checkpoint():
    cold, warm = COMET(num_clusters=2), COMET(num_clusters=2, warm_start=True)
    for algo in (cold, warm):
        algo.setup(_ctx(4, n=1, m=1))
        algo.server_step(1, _points(0, 3.5, 3.6, 3.4))  # round 1: {0} | {3.4..3.6}, centroids 0 and 3.5
    torch.testing.assert_close(warm.centroids, torch.tensor([[0.0], [3.5]], dtype=torch.float64))
    restored = COMET(num_clusters=2, warm_start=True)
    restored.setup(_ctx(4, n=1, m=1))
    restored.load_state_dict(warm.state_dict())
    # round 2 uploads 0, 2, 3, 5: the warm start from 0 and 3.5 keeps 2 with {3, 5}; a fresh start does not
    cold.server_step(2, _points(0, 2, 3, 5))
    assert [cold.cluster_of(i) for i in range(4)] == [0, 0, 1, 1]
    for algo in (warm, restored):
        algo.server_step(2, _points(0, 2, 3, 5))
        assert [algo.cluster_of(i) for i in range(4)] == [0, 1, 1, 1]


def test_fedavg_weighted_mean_skips_integer_buffers():
    states = {0: {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(5)},
              1: {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(9)}}
    avg = weighted_average(states, {0: 1, 1: 3})
    torch.testing.assert_close(avg["w"], torch.tensor([2.5, 5.0]))  # (1*1 + 3*3)/4, (1*2 + 3*6)/4
    assert "n" not in avg
    algo = FedAvg()
    algo.setup(_ctx(2, sizes=[1, 3]))
    result = algo.server_step(1, states)
    assert result.download_bytes == 2 * 4
    assert algo.plan(1) == [LocalFit(2), Upload("weights"), LoadWeights()]


def test_fedavg_refuses_heterogeneous_backbones():
    with pytest.raises(ValueError, match="same backbone.*clients.backbones"):
        FedAvg().validate(["resnet10t", "lcnet_050", "resnet10t"])


def test_cosmos_clusters_uploaders_then_places_a_late_client_at_the_nearest_cluster():
    uploads = _separated(n_clients_per_group=2)
    algo = COSMOS(b0=0.5)
    algo.setup(_ctx(7, n=5, m=3))
    first = {i: u for i, u in uploads.items() if i != 3}  # client 3 misses round 1, client 6 never uploads
    result = algo.server_step(1, first)
    # Algorithm 1: 0 and 4 each have one close neighbour, the lowest index wins first; then {4, 5}; then {2}
    assert algo.clusters == [[0, 1], [4, 5], [2]]
    assert 3 not in result.targets and 6 not in result.targets
    teacher_of_2 = algo.assignment[2]
    torch.testing.assert_close(result.targets[2], uploads[2])  # a perfect teacher of a one-client cluster
    result = algo.server_step(2, {**first, 3: uploads[3]})
    assert algo.assignment[3] == teacher_of_2  # nearest latest aggregate: client 2's cluster
    torch.testing.assert_close(result.targets[3], (uploads[2] + uploads[3]) / 2)
    assert algo.assignment[6] is None and algo.eval_models(6) == {}
    assert set(algo.eval_models(0)) == {"teacher"}
    assert algo.phase(1) == "PTC" and algo.phase(2) == "IFFT"
    assert algo.plan(1) == [Upload("soft"), Distill(3, 5.0, 1, False)]
    assert algo.plan(2)[0] == LocalFit(2)


def test_cosmos_state_dict_round_trips():
    uploads = _separated()
    algo = COSMOS(b0=0.5)
    algo.setup(_ctx(6, n=5, m=3))
    algo.server_step(1, uploads)
    restored = COSMOS(b0=0.5)
    restored.setup(_ctx(6, n=5, m=3))
    restored.load_state_dict(algo.state_dict())
    assert restored.clusters == algo.clusters and restored.assignment == algo.assignment
    for a, b in zip(algo.teachers, restored.teachers):
        torch.testing.assert_close(a.weight, b.weight)


def test_local_only_plan_and_settings_errors():
    algo = LocalOnly()
    algo.setup(_ctx(2))
    assert algo.plan(3) == [LocalFit(2)]
    with pytest.raises(ValueError, match="algorithm.init_args.lambda_=-1"):
        COSMOS(lambda_=-1)
    with pytest.raises(ValueError, match="algorithm.init_args.num_clusters=0"):
        COMET(num_clusters=0)
    with pytest.raises(ValueError, match="algorithm.init_args.b0=-1"):
        COSMOS(b0=-1.0)


def test_name_table_suggests_a_close_match():
    assert set(ALGORITHMS) == {"cosmos", "local", "fedmd", "fedct", "comet", "fedavg", "ditto", "fedbabu", "fedselect",
                               "pfedck", "pfedhn"}
    assert algorithm_class("FedMD") is FedMD
    with pytest.raises(ValueError, match="did you mean 'fedmd'"):
        algorithm_class("fedmdd")


def test_cosmos_client_settings_reach_the_distill_step():
    algo = COSMOS(lambda_=5.0, client_lambda_=0.5, client_freeze_bn=True, client_prior_correction=True)
    algo.setup(_ctx(2))
    assert algo.plan(1) == [Upload("soft"), Distill(3, 0.5, 1, False, freeze_bn=True, prior_correction=True)]
    plain = COSMOS(lambda_=5.0)
    plain.setup(_ctx(2))
    assert plain.plan(1) == [Upload("soft"), Distill(3, 5.0, 1, False, freeze_bn=False)]
    with pytest.raises(ValueError, match="algorithm.init_args.client_lambda_=-1"):
        COSMOS(client_lambda_=-1.0)


def test_comet_says_when_k_exceeds_the_clients():
    lines = []
    algo = COMET(num_clusters=5)
    algo.setup(_ctx_logging(3, lines))
    assert lines == ["warning: algorithm.init_args.num_clusters=5 exceeds data.num_clients=3: COMET uses K = 3 (one "
                     "client per cluster); lower num_clusters"]
    algo = COMET(num_clusters=3)
    algo.setup(_ctx_logging(4, lines := []))
    algo.server_step(1, {0: torch.tensor([[1.0, 0.0]]), 1: torch.tensor([[0.0, 1.0]])})  # two clients failed
    assert lines == ["round 1: COMET: only 2 clients uploaded, fewer than num_clusters=3: K = 2 this round"]
    assert algo.clustering_info()["K"] == 2


def _ctx_logging(n_clients, lines):
    ctx = _ctx(n_clients, n=1)
    ctx.log = lines.append
    return ctx


def test_cosmos_teachers_learn_the_tempered_aggregate_of_their_cluster():
    # two clients in one cluster, 2 public samples, M = 2: mean [[0.7, 0.3], [0.2, 0.8]]
    uploads = {0: torch.tensor([[0.6, 0.4], [0.3, 0.7]]), 1: torch.tensor([[0.8, 0.2], [0.1, 0.9]])}
    hard = COSMOS(b0="inf", temperature=0.0)  # T = 0: one-hot at the argmax
    hard.setup(_ctx(2, n=2, m=2))
    torch.testing.assert_close(hard.server_step(1, uploads).targets[0], torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    # T = 2 tempers each distillation target, p^(1/T) renormalized: the teacher's (the cluster mean) and the
    # clients' (the teacher's pseudo-labels); a perfect teacher's clients so get the mean to the power 1/4
    soft = COSMOS(b0="inf", temperature=2.0)
    soft.setup(_ctx(2, n=2, m=2))
    sent = soft.server_step(1, uploads).targets[1]

    def tempered(rows, power):
        return torch.tensor([[p ** power / sum(q ** power for q in row) for p in row] for row in rows])

    torch.testing.assert_close(soft.teachers[0].learned, tempered([[0.7, 0.3], [0.2, 0.8]], 0.5))
    torch.testing.assert_close(sent, tempered([[0.7, 0.3], [0.2, 0.8]], 0.25))
    maximum = COSMOS(b0="inf", aggregation="max")  # max per class, renormalized: [[0.8, 0.4], [0.3, 0.9]]
    maximum.setup(_ctx(2, n=2, m=2))
    torch.testing.assert_close(maximum.server_step(1, uploads).targets[0],
                               torch.tensor([[0.8 / 1.2, 0.4 / 1.2], [0.3 / 1.2, 0.9 / 1.2]]))
