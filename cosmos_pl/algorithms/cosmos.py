"""COSMOS: clustered server teachers trained on pseudo-labels only.

Source: "COSMOS: Model-Agnostic Personalized Federated Learning with Clustered Server Models and
Pseudo-Label-Only Communication", Sections 4.1 (PTC phase: Algorithm 1, Eq. 1, Eq. 2) and 4.2 (IFFT phase).

Round 1 (PTC): clients upload soft pseudo-labels on U; the server clusters them once with Algorithm 1 (K is an
outcome of B0), averages each cluster's pseudo-labels, trains one teacher per cluster from scratch (Eq. 1) and
sends each client its teacher's pseudo-labels, which the client distills (Eq. 2).
Rounds 2.. (IFFT): local fine-tune on D_i, upload, teacher fine-tune on the new cluster aggregate, client distill.

Scored model: the cluster teacher h_pi(i) (the paper's personalized accuracy, Appendix C); the client model f_i
is reported beside it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

import numpy as np
import torch
from torch import nn

from cosmos_pl.aggregation import AGGREGATIONS, aggregate
from cosmos_pl.algorithms.base import Algorithm, ServerResult, check_setting
from cosmos_pl.clustering import DEFAULT_CONFIDENCE_FLOOR, check_b0, cluster_clients, cluster_inputs, structure
from cosmos_pl.communication import pseudo_label_bytes
from cosmos_pl.errors import ConfigError
from cosmos_pl.losses import apply_temperature
from cosmos_pl.models import check_backbone_name, count_parameters
from cosmos_pl.optim import OptimizerCallable
from cosmos_pl.training.config import register_stage

if TYPE_CHECKING:
    from cosmos_pl.algorithms.base import Step

__all__ = ["COSMOS", "teacher_stage"]

register_stage("teacher", 2)  # seeds each teacher's Eq. 1 training, per round
register_stage("teacher_init", 4)  # seeds each teacher's initial weights

_ADAM_1E4 = {"class_path": "torch.optim.Adam", "init_args": {"lr": 1.0e-4}}


def teacher_stage(model: nn.Module, cluster_labels: torch.Tensor, aggregation: str, temperature: float,
                  x: torch.Tensor, **fit: Any) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """A cluster teacher's round (Section 4.1 Step 3): aggregate its clients' pseudo-labels ``[G, n, M]``
    (mean/median/max), apply the temperature, fit Eq. 1 on U ``x`` ``[n, C, H, W]``, and return the teacher's
    pseudo-labels on U ``[n, M]`` with its per-epoch losses. ``fit`` holds the keywords of
    :func:`~cosmos_pl.objectives.distill.fit_distillation` (``where`` names the teacher in error messages).

    Raises:
        DivergenceError: the teacher's training or its pseudo-labels are non-finite.
    """
    target = apply_temperature(aggregate(cluster_labels, aggregation), temperature)
    from cosmos_pl.objectives.distill import fit_distillation  # Lightning: only where a teacher trains
    from cosmos_pl.training.inference import predict_probs

    losses = fit_distillation(model, x, target, **fit)
    return predict_probs(model, x, fit["trainer"], fit.get("where", "inference"), keep_on_device=True), losses


class COSMOS(Algorithm):
    """COSMOS (Sections 4.1-4.2): Algorithm 1 clustering, one teacher per cluster (Eq. 1), client distillation (Eq. 2).

    Args:
        teacher_backbone: the teachers' architecture (paper: vgg16), one per cluster.
        b0: how clients are clustered. A number: Algorithm 1 at that threshold B0 on the L1 distance per public sample (in [0, 2]). 'auto' (default): cluster by cluster, no single threshold: the best-silhouette cut of an average-linkage hierarchy, then a client on average nearer another cluster leaves its own, and the cut is kept only where it beats chance: its mean silhouette above that of the best cut the same procedure finds in each of 19 shuffles of the distances (every client keeps a teacher of its own otherwise); 'silhouette_floor': the same with a fixed keep rule in place of the chance test (a mean silhouette >= 0.2 that persists in the hierarchy); a client that uploads one distribution for every public sample is left out of these steps and joins the cluster of the informative client nearest it. Threshold rules for Algorithm 1: 'strict': the best silhouette among the clusterings that separate their clusters over the whole federation, else every client alone (no cluster unless every cluster is separated); 'silhouette': the best silhouette among all; 'otsu': Otsu's threshold on the distances; 'inf': one cluster.
        distance: client distance: 'l1' (the paper's, on the soft pseudo-labels), 'l1_hard' (L1 on the one-hot pseudo-labels: twice the fraction of U two clients label differently; it ignores confidence, which the soft distance mixes in) or 'l2'.
        confidence_floor: before the distances, a client whose mean top probability on U is below this is re-tempered (p^beta, renormalized) up to about it, so that flat outputs do not look alike whatever classes they favour; clients above it are compared as uploaded, and the teachers always learn from the uploads as sent. null (default): 0.5 under b0 'auto' and 'silhouette_floor', 0 (the paper's plain distance) under any other b0, so a number or 'strict' reads the distances they read before; a number applies to every b0. Not used with distance 'l1_hard' (the argmax, which re-tempering keeps).
        aggregation: how a cluster's pseudo-labels are combined: mean (paper), median or max.
        ptc_epochs: teacher epochs over U in the PTC round (round 1), training from scratch.
        teacher_epochs: teacher fine-tuning epochs over U in every IFFT round.
        teacher_batch_size: the teachers' batch size.
        teacher_optimizer: teacher optimizer (paper: Adam lr 1e-4); the PTC round trains the teachers from scratch with it.
        teacher_finetune_optimizer: teacher optimizer in IFFT rounds; null uses teacher_optimizer.
        lambda_: lambda, the weight of the consistency regularizer r_B in Eq. 1 and 2 (paper: 5).
        temperature: T applied to pseudo-labels before distillation; 1 keeps them, 0 makes them one-hot (paper: 1).
        num_views: |S|, perturbed views per public sample and step in r_B.
        consistency_target_grad: back-propagate r_B into the clean prediction g(x) as well as the views g(x'); false (default) holds g(x) fixed as r_B's target.
        teacher_augment: the teachers' KL term sees a random T(x) instead of the clean x (Eq. 1 over the transformation ball).
        client_lambda_: lambda of the clients' Eq. 2; null uses lambda_ (the paper uses one lambda for both).
        client_freeze_bn: clients distill with BatchNorm in evaluation mode, keeping the statistics of their own data.
        client_prior_correction: each client shifts the teacher's pseudo-labels to its own label prior before Eq. 2 (label-shift correction; off in the paper).

    Raises:
        ConfigError: a setting out of range, naming the key (``algorithm.init_args.<name>``) and what is allowed.
    """

    name = "cosmos"
    scored = "teacher"

    def __init__(
        self,
        teacher_backbone: str = "resnet10t",
        b0: Union[float, Literal["auto", "silhouette_floor", "strict", "silhouette", "otsu", "inf"]] = "auto",
        distance: Literal["l1", "l1_hard", "l2"] = "l1",
        confidence_floor: Optional[float] = None,
        aggregation: Literal["mean", "median", "max"] = "mean",
        ptc_epochs: int = 5,
        teacher_epochs: int = 1,
        teacher_batch_size: int = 128,
        teacher_optimizer: OptimizerCallable = _ADAM_1E4,  # type: ignore[assignment]
        teacher_finetune_optimizer: Optional[OptimizerCallable] = None,
        lambda_: float = 5.0,
        temperature: float = 1.0,
        num_views: int = 1,
        consistency_target_grad: bool = False,
        teacher_augment: bool = False,
        client_lambda_: Optional[float] = None,
        client_freeze_bn: bool = False,
        client_prior_correction: bool = False,
    ) -> None:
        check_setting("lambda_", lambda_, math.isfinite(lambda_) and lambda_ >= 0, "finite and >= 0 (paper: 5)")
        check_setting("temperature", temperature, math.isfinite(temperature) and temperature >= 0,
                      "finite and >= 0 (0 = hard labels, 1 = unchanged)")
        check_setting("num_views", num_views, num_views >= 1, ">= 1")
        check_setting("client_lambda_", client_lambda_,
                      client_lambda_ is None or (math.isfinite(client_lambda_) and client_lambda_ >= 0),
                      "finite and >= 0, or null (= lambda_)")
        check_setting("ptc_epochs", ptc_epochs, ptc_epochs >= 1, ">= 1 (teachers train from scratch in PTC)")
        check_setting("teacher_epochs", teacher_epochs, teacher_epochs >= 0, ">= 0")
        check_setting("teacher_batch_size", teacher_batch_size, teacher_batch_size >= 1, ">= 1")
        check_setting("aggregation", aggregation, aggregation in AGGREGATIONS, f"one of {AGGREGATIONS}")
        check_setting("distance", distance, distance in ("l1", "l1_hard", "l2"), "'l1' (paper), 'l1_hard' or 'l2'")
        check_setting("confidence_floor", confidence_floor, confidence_floor is None or 0 <= confidence_floor < 1,
                      "a mean top probability in [0, 1) (0: the paper's plain distance), or null "
                      f"({DEFAULT_CONFIDENCE_FLOOR} under b0 'auto' and 'silhouette_floor', 0 otherwise)")
        check_backbone_name(teacher_backbone, "algorithm.init_args.teacher_backbone")  # before any data is loaded
        try:  # a bad B0 fails now, not after round 0 has trained
            check_b0(b0)
        except ValueError as err:
            raise ConfigError(f"algorithm.init_args.{err}") from None
        self.teacher_backbone, self.b0, self.distance, self.aggregation = teacher_backbone, b0, distance, aggregation
        # the floor is part of the default rule; the threshold rules keep the paper's distance unless asked
        self.confidence_floor = (confidence_floor if confidence_floor is not None else
                                 DEFAULT_CONFIDENCE_FLOOR if b0 in ("auto", "silhouette_floor") else 0.0)
        self.ptc_epochs, self.teacher_epochs, self.teacher_batch_size = ptc_epochs, teacher_epochs, teacher_batch_size
        self.teacher_optimizer = teacher_optimizer
        self.teacher_finetune_optimizer = teacher_finetune_optimizer
        self.lambda_, self.temperature, self.num_views = lambda_, temperature, num_views
        self.consistency_target_grad = consistency_target_grad
        self.teacher_augment, self.client_freeze_bn = teacher_augment, client_freeze_bn
        self.client_prior_correction = client_prior_correction
        self.client_lambda_ = lambda_ if client_lambda_ is None else client_lambda_

    # ------------------------------------------------------------------ state
    def server_backbones(self) -> dict[str, str]:
        return {"algorithm.init_args.teacher_backbone": self.teacher_backbone}

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.clusters: list[list[int]] = []
        self.assignment: list[Optional[int]] = [None] * ctx.num_clients
        self.teachers: list[nn.Module] = []
        self.centroids: list[Optional[torch.Tensor]] = []  # each cluster's latest aggregate [n, M], to place late clients
        self.b0_value: Optional[float] = None  # Algorithm 1's threshold (None under 'auto', which uses none)
        self.how: Optional[str] = None  # how the clusters were chosen (ClientClustering.describe)
        self.distance_samples: Optional[int] = None  # public samples the distances were computed on
        self.constant_clients: list[int] = []  # clients whose pseudo-labels were the same for every public sample
        self.tempered_clients: list[int] = []  # clients re-tempered to the confidence floor for the distances
        self.placed_clients: dict[int, int] = {}  # uninformative client -> the informative client it was placed with
        self.distances: Optional[np.ndarray] = None
        self.structure: Optional[dict[str, Any]] = None  # how clear the clustering was (Structure.as_dict)

    def phase(self, rnd: int) -> str:
        return "PTC" if rnd == 1 else "IFFT"

    def plan(self, rnd: int) -> list[Step]:
        from cosmos_pl.objectives.distill import Distill
        from cosmos_pl.objectives.local_fit import LocalFit
        from cosmos_pl.objectives.protocol import Upload

        steps: list[Step] = [] if rnd == 1 else [LocalFit(self.ctx.local_epochs)]
        return steps + [Upload("soft"), Distill(self.ctx.distill_epochs, self.client_lambda_, self.num_views,
                                                self.consistency_target_grad, freeze_bn=self.client_freeze_bn,
                                                prior_correction=self.client_prior_correction)]

    # ------------------------------------------------------------------ clustering (Algorithm 1)
    def set_clusters(self, clusters: list[list[int]]) -> None:
        """Fix the clusters (e.g. for a timing benchmark or an ablation) and create their teachers untrained."""
        self.clusters = [sorted(c) for c in clusters]
        self.centroids = [None] * len(self.clusters)
        for k, members in enumerate(self.clusters):
            for i in members:
                self.assignment[i] = k
        self.teachers = [self.ctx.make_backbone(self.teacher_backbone, self.ctx.stage_seed(0, "teacher_init", k))
                         for k in range(len(self.clusters))]

    def _cluster(self, ids: list[int], uploads: torch.Tensor) -> None:
        # every public sample, or a fixed subsample where exact distances cost too much
        got = cluster_inputs(uploads, self.distance, self.confidence_floor)
        if got.samples < uploads.shape[1]:
            self.ctx.log(f"client distances estimated on {got.samples:,} of the {uploads.shape[1]:,} public samples (a "
                         f"fixed random subsample): exact ones for {len(ids)} clients would cost more than the budget")
        self.distances = got.distances
        constant = [ids[j] for j in got.uninformative]
        self.tempered_clients = [ids[j] for j in sorted(got.tempered)]
        if self.tempered_clients:
            self.ctx.log(f"confidence floor: client(s) {self.tempered_clients} uploaded flat pseudo-labels (mean top "
                         f"probability under {self.confidence_floor}): re-tempered toward it for the distances only")
        found = cluster_clients(self.b0, self.distances, uninformative=got.uninformative)
        if constant:
            if self.b0 not in ("auto", "silhouette_floor"):
                how = ""
            elif found.read_all:
                how = (f" (too few informative clients to place them by: b0 {self.b0} read every client, so these may share "
                       "a teacher for their priors' sake)")
            else:
                how = f" (b0 {self.b0} placed them after the others: see the clustering line)"
            self.ctx.log(f"warning: client(s) {constant} uploaded nearly the same pseudo-label for every public sample "
                         "(they learnt little beyond their label prior): their distances compare priors, not data"
                         f"{how}. Raise clients.pretrain_epochs or give them more data")
        self.distance_samples, self.constant_clients = got.samples, constant
        self.placed_clients = {ids[c]: ids[j] for c, j in found.placed.items()}
        self.b0_value, self.how = found.b0, found.describe(ids)
        self.set_clusters([[ids[j] for j in members] for members in found.clusters])
        st = structure(self.distances, found.labels)
        self.structure = st.as_dict()
        sil = "-" if st.silhouette is None else f"{st.silhouette:.3f}"
        self.ctx.log(f"clustering: {self.how} -> K={len(self.clusters)} clusters {self.clusters}; "
                     f"{st.alone} client(s) alone; silhouette {sil}, farthest within a cluster {st.within_max:.3f}, "
                     f"nearest between clusters {st.between_min:.3f}")
        self._warn_one_architecture()
        if st.weak and self.b0 != "inf":
            alone = st.K == st.N  # strict's fallback, or b0: 0 (only identical clients share a teacher)
            effect = ("each client has its own teacher" if alone else
                      "a teacher may mix clients of different distributions and score below local-only")
            self.ctx.log(f"warning: weak cluster structure ({'; '.join(st.reasons())}): {effect}. Set "
                         "algorithm.init_args.b0 to a number (distances in clusters.json) or 'inf' (one "
                         "distribution), or raise clients.pretrain_epochs so that the first upload separates the "
                         "clients")

    def _warn_one_architecture(self) -> None:
        """Name each cluster of three or more clients that all run one architecture while the federation runs
        several: clients of one architecture can agree on U for the architecture's sake (the classes they never saw
        mapped alike), not their data's; measured on digits_smoke and Fashion-MNIST at 40 clients, such clusters
        held clients of every group. Only a warning: a group may well share an architecture."""
        backbones = self.ctx.backbones
        if len(set(backbones)) < 2:
            return
        for members in self.clusters:
            kinds = {backbones[i] for i in members}
            if len(members) >= 3 and len(kinds) == 1:
                self.ctx.log(f"warning: cluster {members} holds only {kinds.pop()} clients, of the "
                             f"{len(set(backbones))} architectures in the federation: one architecture can make "
                             "uploads agree beyond the data; compare its teacher with these clients' round-0 accuracy "
                             "(clients.csv), or set algorithm.init_args.b0")

    def _place_newcomers(self, ids: list[int], uploads: torch.Tensor) -> None:
        """A client that missed the clustering round joins the cluster whose latest aggregate is nearest (L1)."""
        known = [k for k, c in enumerate(self.centroids) if c is not None]
        for j, i in enumerate(ids):
            if self.assignment[i] is None and known:
                d = [float((uploads[j] - self.centroids[k]).abs().sum(dim=1).mean()) for k in known]
                k = known[int(np.argmin(d))]
                self.clusters[k] = sorted(self.clusters[k] + [i])
                self.assignment[i] = k

    # ------------------------------------------------------------------ the server step
    def server_step(self, rnd: int, uploads: dict[int, torch.Tensor]) -> ServerResult:
        ids = sorted(uploads)
        stacked = torch.stack([uploads[i] for i in ids])
        ptc = not self.clusters  # the first round with uploads clusters them and trains teachers from scratch
        if ptc:
            if len(ids) < self.ctx.num_clients:  # clients_per_round, or clients that failed this round
                self.ctx.log(f"round {rnd}: COSMOS clusters the {len(ids)} of {self.ctx.num_clients} clients that "
                             "uploaded (Algorithm 1); every later client joins the nearest of these clusters, so a "
                             "group none of them belongs to gets no cluster of its own: raise clients_per_round to "
                             "cluster more of them")
            self._cluster(ids, stacked)
        else:
            self._place_newcomers(ids, stacked)
        row = {i: j for j, i in enumerate(ids)}
        finetune = not ptc and self.teacher_finetune_optimizer is not None
        optimizer = self.teacher_finetune_optimizer if finetune else self.teacher_optimizer
        optimizer_key = f"algorithm.init_args.teacher_{'finetune_' if finetune else ''}optimizer"
        epochs = self.ptc_epochs if ptc else self.teacher_epochs
        # a cluster with no upload this round keeps its teacher untouched
        trained = [k for k, members in enumerate(self.clusters) if any(i in row for i in members)]
        public = self.ctx.public
        tasks = []
        for k in trained:
            labels = stacked[[row[i] for i in self.clusters[k] if i in row]]
            tasks.append((teacher_stage, dict(
                model=self.teachers[k], cluster_labels=labels, aggregation=self.aggregation,
                temperature=self.temperature, x=public, epochs=epochs, batch_size=self.teacher_batch_size,
                optimizer=optimizer, transformations=self.ctx.transformations, lam=self.lambda_,
                num_views=self.num_views, trainer=self.ctx.trainer, seed=self.ctx.stage_seed(rnd, "teacher", k),
                target_grad=self.consistency_target_grad, augment=self.teacher_augment,
                where=f"round {rnd}, teacher distillation, teacher of cluster {k} (clients {self.clusters[k]})",
                optimizer_key=optimizer_key)))
        costs = [count_parameters(self.teachers[k]) * len(public) * max(epochs, 1) for k in trained]
        results = self.ctx.run_tasks(rnd, "teacher distillation", tasks, costs, trains=True)
        targets: dict[int, torch.Tensor] = {}
        losses: dict[str, list[float]] = {}
        for k, (model, (labels, epoch_losses)) in zip(trained, results):
            self.teachers[k] = model
            self.centroids[k] = aggregate(stacked[[row[i] for i in self.clusters[k] if i in row]], self.aggregation)
            sent = apply_temperature(labels, self.temperature)
            for i in self.clusters[k]:
                targets[i] = sent
            if epoch_losses:
                for key, value in epoch_losses[-1].items():
                    losses.setdefault(f"teacher_{key}", []).append(value)
        n, m = len(public), self.ctx.num_classes
        return ServerResult(targets, pseudo_label_bytes(n, m), {k: float(np.mean(v)) for k, v in losses.items()})

    # ------------------------------------------------------------------ evaluation and records
    def eval_models(self, client: int) -> dict[str, nn.Module]:
        k = self.assignment[client]
        return {} if k is None or not self.teachers else {"teacher": self.teachers[k]}

    def cluster_of(self, client: int) -> Optional[int]:
        return self.assignment[client]

    def clustering_info(self) -> Optional[dict[str, Any]]:
        if not self.clusters:
            return None
        return {"b0": self.b0_value, "b0_setting": self.b0, "chosen_by": self.how, "distance": self.distance,
                "distance_samples": self.distance_samples, "constant_clients": self.constant_clients,
                "confidence_floor": self.confidence_floor, "tempered_clients": self.tempered_clients,
                "placed_clients": {str(c): j for c, j in self.placed_clients.items()},
                "K": len(self.clusters),
                "assignment": [-1 if a is None else a for a in self.assignment], "clusters": self.clusters,
                "structure": self.structure,
                "distances": None if self.distances is None else self.distances.round(6).tolist()}

    def state_dict(self) -> dict[str, Any]:
        return {"clusters": self.clusters, "assignment": self.assignment, "b0_value": self.b0_value, "how": self.how,
                "distance_samples": self.distance_samples, "constant_clients": self.constant_clients,
                "tempered_clients": self.tempered_clients, "placed_clients": self.placed_clients,
                "structure": self.structure,
                "distances": None if self.distances is None else torch.from_numpy(self.distances),
                "centroids": self.centroids, "teachers": [t.state_dict() for t in self.teachers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_clusters(state["clusters"])
        self.assignment = list(state["assignment"])
        self.b0_value, self.how = state["b0_value"], state.get("how")
        self.distance_samples, self.constant_clients = state.get("distance_samples"), state.get("constant_clients", [])
        self.tempered_clients = state.get("tempered_clients", [])
        self.placed_clients = state.get("placed_clients", {})
        self.structure = state.get("structure")
        self.distances = None if state["distances"] is None else state["distances"].numpy()
        self.centroids = list(state["centroids"])
        for teacher, weights in zip(self.teachers, state["teachers"]):
            teacher.load_state_dict(weights)
