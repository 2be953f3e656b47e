"""Whole rounds of Ditto, FedBABU and COMET (sequential) on a bias-free linear model, checked against values worked
out by hand.

Each test runs the in-process round loop (:class:`~cosmos_pl.federated.runner.Runner`, sequential executor, CPU)
on a federation of flattened 1x2x2 uint8 images and 3 classes, where every client model is a bias-free linear layer
(or two of them, for FedBABU's body and head). SGD without momentum, the whole client set in one batch and no
augmentation make every training stage one closed-form step, computed here from the definitions:

- model input ``x = (pixel / 255 - 0.5) / 0.5`` flattened to ``[n, 4]``, logits ``x W^T``;
- cross-entropy's gradient ``(softmax(x W^T) - onehot(y))^T x / n``;
- the KL distillation gradient (batchmean, ``KL(t || softmax(u W^T))``): ``(softmax(u W^T) - t)^T u / n_u``;
- Ditto's proximal term ``lam / 2 ||v - w||^2`` adds ``lam (v - w)`` to the gradient.

The client models are set by hand before round 1 (in place of round 0's training), so that the personal models,
the global copies and the shared initialization all differ.
"""

from __future__ import annotations

import functools
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn

from cosmos_pl.algorithms import COMET, Ditto, FedBABU
from cosmos_pl.data import ClientData, Federation
from cosmos_pl.data.partition import Partition
from cosmos_pl.federated import initial_models
from cosmos_pl.execution.executor import ExecutorConfig
from cosmos_pl.federated.runner import Runner, RunSettings
from cosmos_pl.training.client import ClientConfig
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.transforms import Transformations

M = 3  # classes
NO_AUGMENTATION = Transformations(translate=0, hflip=False, noise_radius=0.0)


# --------------------------------------------------------------------------- the round loop on a tiny model
def _federation(train: list[tuple[list, list]], test: list[tuple[list, list]], public: list) -> Federation:
    """Clients' ``(images [n][4] 0..255, labels [n])`` for training and testing, and U ``[n][4]``, as 1x2x2 uint8."""
    def images(rows):
        return torch.tensor(rows, dtype=torch.uint8).reshape(-1, 1, 2, 2)

    clients = [ClientData(x=images(x), y=torch.tensor(y), x_test=images(xt), y_test=torch.tensor(yt),
                          class_counts=np.bincount(y, minlength=M))
               for (x, y), (xt, yt) in zip(train, test)]
    starts = np.cumsum([0] + [len(y) for _, y in train])
    return Federation(public=images(public), clients=clients,
                      partition=Partition([np.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]),
                      partition_labels=np.concatenate([np.array(y) for _, y in train]), num_classes=M,
                      classes=["a", "b", "c"], in_chans=1, image_shape=(2, 2))


def _runner(federation: Federation, algorithm, build, lr: float, distill_lr: float = 0.0) -> Runner:
    """A sequential CPU runner whose every backbone is ``build()`` (created under the seed each model is made with), SGD at ``lr``
    on labels and ``distill_lr`` on pseudo-labels, one epoch per stage, one batch per epoch."""

    class TinyRunner(Runner):
        def make_backbone(self, name: str, seed: int) -> nn.Module:
            torch.manual_seed(seed)
            model = build()
            model.backbone_name = name
            return model

    clients = ClientConfig(backbones=["test_efficientnet"], pretrain_epochs=0, local_epochs=1, distill_epochs=1,
                           batch_size=64, optimizer=functools.partial(torch.optim.SGD, lr=lr),
                           distill_optimizer=functools.partial(torch.optim.SGD, lr=distill_lr))
    # the clients' initial models (built as the runner is) and the server's own copies (reference weights) alike
    with mock.patch.object(initial_models, "create_backbone", lambda *args: build()):
        return TinyRunner(federation, algorithm, clients, RunSettings(
            rounds=2, transformations=NO_AUGMENTATION, trainer=TrainerConfig(accelerator="cpu"),
            executor=ExecutorConfig(kind="sequential", threads_per_worker=1)))


def _linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(4, M, bias=False))


def _inputs(images: torch.Tensor) -> torch.Tensor:
    """The model's input by its definition: pixels to [0, 1], then to [-1, 1], flattened ``[n, 4]``."""
    return ((images.double() / 255 - 0.5) / 0.5).flatten(1)


def _ce_gradient(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gradient of the mean cross-entropy of logits ``x w^T`` w.r.t. ``w`` ``[M, 4]``."""
    err = torch.softmax(x @ w.T, dim=1) - nn.functional.one_hot(y, M).double()
    return err.T @ x / len(y)


def _kl_gradient(w: torch.Tensor, u: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Gradient of ``(1/n) sum_u KL(t(u) || softmax(u w^T))`` w.r.t. ``w``."""
    return (torch.softmax(u @ w.T, dim=1) - t.double()).T @ u / len(u)


def _accuracy(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return float(((x @ w.T).argmax(1) == y).double().mean())


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.detach().double(), expected, rtol=1e-5, atol=1e-6)


class _Recording:
    """Mixed into an algorithm: keeps each round's uploads and the server's targets."""

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.uploads, self.targets = {}, {}

    def server_step(self, rnd, uploads):
        self.uploads[rnd] = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in u.items()}
                             if isinstance(u, dict) else u.clone() for i, u in uploads.items()}
        result = super().server_step(rnd, uploads)
        self.targets[rnd] = result.targets
        return result


class RecordingDitto(_Recording, Ditto):
    pass


class RecordingFedBABU(_Recording, FedBABU):
    pass


class RecordingCOMET(_Recording, COMET):
    pass


# --------------------------------------------------------------------------- Ditto
# bright images (inputs near +1), so a weight row of +a makes its class win on every input
DITTO_TRAIN = [([[255, 230, 200, 255], [210, 255, 255, 220]], [0, 2]),                      # client 0: 2 samples
               ([[255, 255, 240, 200], [220, 200, 255, 255], [255, 210, 230, 240], [200, 255, 220, 255]],
                [1, 1, 0, 1])]                                                              # client 1: 4 samples
DITTO_TEST = [([[250, 240, 230, 220], [200, 210, 220, 230]], [0, 0]), ([[240, 250, 220, 210]], [1])]


def test_ditto_round_pulls_the_personal_model_to_the_round_start_global_model_and_averages_the_copies():
    """Ditto (Li et al., 2021, Algorithm 1) over two rounds, every value by hand.

    Client i starts round 1 with personal model P_i and a global copy at the shared initialization S0 (not yet a
    global model). Round 1: StartGlobal makes the copy P_i; ProxFit: V1_i = P_i - lr (g_i(P_i) + lam (P_i - P_i));
    LocalFit(shared): G1_i = P_i - lr g_i(P_i); the server averages W1 = (2 G1_0 + 4 G1_1) / 6 and every client loads
    it. Round 2: V2_i = V1_i - lr (g_i(V1_i) + lam (V1_i - W1)) (the pull is to W1, the global model held at the
    round's start), G2_i = W1 - lr g_i(W1), W2 = (2 G2_0 + 4 G2_1) / 6. The personal model is scored.

    Which assertion catches which fault:
    - ProxFit after LocalFit(shared) (anchor G1_i, G2_i), or after LoadWeights (anchor W1 in round 1, W2 in round 2:
      the new average): the V1 check already (round 1's anchor must be P_i), and the V2 check;
    - StartGlobal dropped (round 1 anchors and trains the copy from S0): the V1 and G1 checks;
    - the personal model uploaded instead of the global copy: the round-2 upload check (V2_i != G2_i);
    - a plain mean instead of the sample-weighted one: the W1 check;
    - the global copy scored instead of the personal model: the accuracy check (client 0: 1.0 personal, 0.0 global).
    """
    lr, lam, a = 0.5, 1.0, 2.0
    fed = _federation(DITTO_TRAIN, DITTO_TEST, [[0, 0, 0, 0]])
    algorithm = RecordingDitto(lambda_=lam)
    runner = _runner(fed, algorithm, _linear, lr)
    personal = [torch.zeros(M, 4, dtype=torch.float64), torch.zeros(M, 4, dtype=torch.float64)]
    personal[0][0], personal[1][1] = a, a  # client 0 predicts class 0 everywhere, client 1 class 1
    personal[0][2, 1], personal[1][2, 3] = 0.5, -0.5  # the two clients differ in more than one row
    try:
        clients = runner.clients.clients
        s0 = clients[0].model.shared[1].weight.detach().double().clone()
        assert torch.equal(s0, clients[1].model.shared[1].weight.detach().double())  # one shared initialization
        with torch.no_grad():
            for c, p in zip(clients, personal):
                c.model.personal[1].weight.copy_(p)
        assert not torch.allclose(s0, personal[0]) and not torch.allclose(s0, personal[1])

        xs = [_inputs(c.data.x) for c in clients]
        ys = [c.data.y for c in clients]
        sizes = [len(y) for y in ys]
        assert sizes == [2, 4]

        # ---- round 1
        runner.train_round(1)
        v1 = [p - lr * (_ce_gradient(p, x, y) + lam * (p - p)) for p, x, y in zip(personal, xs, ys)]
        g1 = [p - lr * _ce_gradient(p, x, y) for p, x, y in zip(personal, xs, ys)]
        w1 = (sizes[0] * g1[0] + sizes[1] * g1[1]) / sum(sizes)
        for i, c in enumerate(clients):
            assert sorted(algorithm.uploads[1][i]) == ["shared.1.weight"]  # the global copy, nothing personal
            _close(algorithm.uploads[1][i]["shared.1.weight"], g1[i])
            _close(c.model.personal[1].weight, v1[i])
            _close(c.model.shared[1].weight, w1)
        assert not torch.allclose(w1, (g1[0] + g1[1]) / 2, atol=1e-3)  # the weighting matters here

        # ---- round 2
        runner.train_round(2)
        v2 = [v - lr * (_ce_gradient(v, x, y) + lam * (v - w1)) for v, x, y in zip(v1, xs, ys)]
        g2 = [w1 - lr * _ce_gradient(w1, x, y) for x, y in zip(xs, ys)]
        w2 = (sizes[0] * g2[0] + sizes[1] * g2[1]) / sum(sizes)
        for i, c in enumerate(clients):
            _close(algorithm.uploads[2][i]["shared.1.weight"], g2[i])
            _close(c.model.personal[1].weight, v2[i])
            _close(c.model.shared[1].weight, w2)
            # the alternatives differ from v2 by far more than the tolerance
            for anchor in (g2[i], w2, s0, personal[i]):
                wrong = v1[i] - lr * (_ce_gradient(v1[i], xs[i], ys[i]) + lam * (v1[i] - anchor))
                assert (wrong - v2[i]).abs().max() > 1e-2
            assert (v2[i] - g2[i]).abs().max() > 1e-2

        # ---- the personal model is scored
        runner.evaluate(2, "federated")
        scored = {r["client"]: r["client_acc"] for r in runner.recorder.client_rows if r["round"] == 2}
        for i, c in enumerate(clients):
            xt, yt = _inputs(c.data.x_test), c.data.y_test
            assert scored[i] == pytest.approx(_accuracy(v2[i], xt, yt))
        assert _accuracy(v2[0], _inputs(clients[0].data.x_test), clients[0].data.y_test) == 1.0
        assert _accuracy(w2, _inputs(clients[0].data.x_test), clients[0].data.y_test) == 0.0
    finally:
        runner.executor.close()


# --------------------------------------------------------------------------- FedBABU
def _body_and_head() -> nn.Module:
    """Body ``1`` (4 -> 3) and classifier head ``2`` (3 -> 3), both bias-free."""
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3, bias=False), nn.Linear(3, M, bias=False))


def _two_layer_gradients(b: torch.Tensor, h: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
    """Gradients of the mean cross-entropy of logits ``(x b^T) h^T`` w.r.t. the body ``b`` and the head ``h``."""
    z = x @ b.T
    err = (torch.softmax(z @ h.T, dim=1) - nn.functional.one_hot(y, M).double()) / len(y)
    return (err @ h).T @ x, err.T @ z


def test_fedbabu_rounds_keep_the_head_at_its_initialization_and_average_the_bodies_by_sample_count():
    """FedBABU (Oh et al., 2022) over two rounds, every value by hand.

    Client i starts round 1 with a personal model (body B_i, head Q_i) and a global copy at the shared
    initialization (body S0, head H0). Each round: StartGlobal(with_head=False) makes the copy's body B_i once (its
    head stays H0); LocalFit(shared) trains the body alone (the head is frozen): G_i = body - lr grad_b(body, H0);
    the bodies alone are uploaded and averaged by sample count, W = (2 G_0 + 4 G_1) / 6; FineTune makes the personal
    model (W, H0) and trains both layers one step.

    Which assertion catches which fault: a head that travels or trains (the upload keys and the H0 checks); the
    round-0 head copied by StartGlobal (H0 checks); a plain mean (the W check); fine-tuning that does not start from
    the global body with the initial head (the personal-model checks).
    """
    lr = 0.5
    fed = _federation(DITTO_TRAIN, DITTO_TEST, [[0, 0, 0, 0]])
    algorithm = RecordingFedBABU(finetune_epochs=1)
    runner = _runner(fed, algorithm, _body_and_head, lr)
    try:
        clients = runner.clients.clients
        s0 = clients[0].model.shared[1].weight.detach().double().clone()
        h0 = clients[0].model.shared[2].weight.detach().double().clone()
        bodies = [s0 + 0.7, s0 - 0.4]
        heads = [h0 * -1.5, h0 + 0.9]  # personal heads that differ from the shared one
        with torch.no_grad():
            for c, b, h in zip(clients, bodies, heads):
                c.model.personal[1].weight.copy_(b)
                c.model.personal[2].weight.copy_(h)
        xs = [_inputs(c.data.x) for c in clients]
        ys = [c.data.y for c in clients]
        sizes = [2, 4]

        body = bodies
        for rnd in (1, 2):
            runner.train_round(rnd)
            g = [b - lr * _two_layer_gradients(b, h0, x, y)[0] for b, x, y in zip(body, xs, ys)]
            w = (sizes[0] * g[0] + sizes[1] * g[1]) / sum(sizes)
            assert not torch.allclose(w, (g[0] + g[1]) / 2, atol=1e-3)
            for i, c in enumerate(clients):
                assert sorted(algorithm.uploads[rnd][i]) == ["shared.1.weight"]  # the body alone travels
                _close(algorithm.uploads[rnd][i]["shared.1.weight"], g[i])
                _close(c.model.shared[1].weight, w)
                _close(c.model.shared[2].weight, h0)  # the global head: its shared initialization
                grad_b, grad_h = _two_layer_gradients(w, h0, xs[i], ys[i])  # fine-tuning from (W, H0)
                _close(c.model.personal[1].weight, w - lr * grad_b)
                _close(c.model.personal[2].weight, h0 - lr * grad_h)
                assert (lr * grad_h).abs().max() > 1e-3  # fine-tuning moved the personal head
            body = [w, w]
    finally:
        runner.executor.close()


# --------------------------------------------------------------------------- COMET, sequential
COMET_TRAIN = [([[255, 0, 128, 60], [30, 255, 200, 0]], [0, 1]),
               ([[200, 40, 90, 255], [0, 0, 255, 128]], [1, 2]),
               ([[128, 128, 0, 255], [255, 60, 30, 90]], [2, 0]),
               ([[10, 200, 255, 40], [90, 255, 0, 180]], [0, 2])]
COMET_PUBLIC = [[255, 0, 0, 255], [0, 255, 128, 0], [200, 100, 50, 0]]


def test_comet_sequential_distills_to_the_cluster_mean_then_trains_on_local_data():
    """COMET, ``mode: sequential`` with ``warm_start`` (the COSMOS authors' protocol), two rounds by hand.

    Clients 0 and 1 hold weights near A, clients 2 and 3 near B (two planted clusters, K = 2). Each round: each
    client uploads p_i = softmax(u W_i^T) on U; K-means finds {0, 1} and {2, 3}; client i's target is the mean of
    its cluster's uploads; then Distill: W' = W_i - lr_d (softmax(u W_i^T) - t_i)^T u / |U|; then LocalFit:
    W'' = W' - lr g_i(W').

    Which assertion catches which fault: a target other than the cluster mean (the target check and the weights);
    LocalFit before Distill (the weight check: the other order gives values far off, asserted too).
    """
    lr, lr_distill = 0.3, 2.0
    fed = _federation(COMET_TRAIN, [([[0, 0, 0, 0]], [0])] * 4, COMET_PUBLIC)
    algorithm = RecordingCOMET(num_clusters=2, mode="sequential", warm_start=True)
    runner = _runner(fed, algorithm, _linear, lr, lr_distill)
    a = torch.tensor([[1.5, -1.0, 0.5, 0.0], [-1.0, 1.5, 0.0, 0.5], [0.0, 0.0, -1.0, 1.0]], dtype=torch.float64)
    b = -a.flip(0)
    nudge = torch.tensor([[0.3, 0.0, 0.0, -0.2], [0.0, 0.0, 0.2, 0.0], [0.0, 0.3, 0.0, 0.0]], dtype=torch.float64)
    weights = [a, a + nudge, b, b - nudge]
    try:
        clients = runner.clients.clients
        with torch.no_grad():
            for c, w in zip(clients, weights):
                c.model[1].weight.copy_(w)
        u = _inputs(fed.public)
        xs = [_inputs(c.data.x) for c in clients]
        ys = [c.data.y for c in clients]
        for rnd in (1, 2):
            runner.train_round(rnd)
            uploads = [torch.softmax(u @ w.T, dim=1) for w in weights]
            for i in range(4):
                _close(algorithm.uploads[rnd][i], uploads[i])
            assert algorithm.assignment == [0, 0, 1, 1]
            targets = [(uploads[0] + uploads[1]) / 2] * 2 + [(uploads[2] + uploads[3]) / 2] * 2
            new = []
            for i, c in enumerate(clients):
                _close(algorithm.targets[rnd][i], targets[i])
                assert (targets[i] - uploads[i]).abs().max() > 1e-3  # not the client's own upload
                distilled = weights[i] - lr_distill * _kl_gradient(weights[i], u, targets[i])
                expected = distilled - lr * _ce_gradient(distilled, xs[i], ys[i])
                _close(c.model[1].weight, expected)
                local_first = weights[i] - lr * _ce_gradient(weights[i], xs[i], ys[i])
                swapped = local_first - lr_distill * _kl_gradient(local_first, u, targets[i])
                assert (swapped - expected).abs().max() > 1e-3  # the order is visible in the values
                new.append(expected)
            weights = new
    finally:
        runner.executor.close()
