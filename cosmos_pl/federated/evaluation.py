"""A round's records from the clients' scores: one row per client (``clients.csv``) and the round's row
(``metrics.csv``), and the run's summary (``summary.json``).

Personalized accuracy (COSMOS paper, Section 6): each client is scored on a test set drawn from its own
distribution; the headline is the mean over clients of the algorithm's scored model (COSMOS: the cluster teacher
h_pi(i); the baselines: the client's own f_i), with its SEM over clients. A client with an empty test (or
validation) split has an undefined (NaN) accuracy, never 0: the means and SEMs skip it, and
``personalized_acc_clients`` counts the clients averaged into the headline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from cosmos_pl.federated.clients import ClientInfo, Scores
from cosmos_pl.federated.failures import Failure
from cosmos_pl.report import METRIC_LABEL, mean_sem

__all__ = ["ACC_KEYS", "RoundOutcome", "RunRecord", "round_rows", "round_line", "summarize_run", "structure_columns",
           "with_adjusted_rand_index"]

ACC_KEYS = ("teacher_acc", "client_acc", "teacher_top5", "client_top5", "teacher_val_acc", "client_val_acc",
            "teacher_prior_acc")


@dataclass
class RoundOutcome:
    """What one round ended with, as its records are made from it (:func:`round_rows`).

    Attributes:
        rnd: the round (0: local-only). phase: its label in the records.
        scores: the clients' scores (:meth:`~cosmos_pl.federated.clients.Clients.end_round`).
        clusters: each client's cluster (None: none).
        failed: this round's failures by client.
        num_clusters: K after this round, or None.
        comm: the round's bytes per client (``upload_bytes_per_client``, ``download_bytes_per_client``; with sampled
            clients ``clients_in_round``).
        losses: the round's mean losses by name.
    """

    rnd: int
    phase: str
    scores: Scores
    clusters: dict[int, Optional[int]]
    failed: dict[int, Failure]
    num_clusters: Optional[int]
    comm: dict[str, int]
    losses: dict[str, float]


@dataclass
class RunRecord:
    """What a run recorded over its rounds, which its summary is made from (:func:`summarize_run`).

    Attributes:
        rows: metrics.csv's rows, round 0 first. infos: the clients as they described themselves.
        failures: every client failure of the run. clusters_info: clusters.json's record ({} without clusters).
        extra_bytes: bytes per client beside the protocol's, per round: ``"evaluation"`` (models sent to be scored)
            and ``"setup"`` (what nodes are sent once).
        round_seconds: wall seconds per round. timer: the stages' seconds (``seconds``: per stage; ``by_round``:
            per round, then stage). wall: the run's wall seconds.
        rounds: R. public_samples: |U|. num_classes: M.
    """

    rows: list[dict[str, Any]]
    infos: list[ClientInfo]
    failures: list[Failure]
    clusters_info: dict[str, Any]
    extra_bytes: dict[str, list[int]]
    round_seconds: dict[int, float]
    timer: Any
    wall: float
    rounds: int
    public_samples: int
    num_classes: int


def round_rows(outcome: RoundOutcome, infos: list[ClientInfo],
               scored: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(round row, client rows)`` of round ``outcome.rnd`` from the clients' scores, for the clients ``infos``;
    ``scored``: ``"teacher"`` or ``"client"``, the algorithm's headline model (the teacher where it was scored)."""
    rnd, scores, failed = outcome.rnd, outcome.scores, outcome.failed
    per_client = []
    for c in infos:
        test, val = scores.get((c.id, "test"), {}), scores.get((c.id, "val"))
        teacher, own = test.get("teacher", {}), test.get("client", {})
        cluster = outcome.clusters.get(c.id)
        failure = failed.get(c.id)
        row = {"round": rnd, "client": c.id, "backbone": c.backbone, "cluster": -1 if cluster is None else cluster,
               "teacher_acc": teacher.get("top1"), "client_acc": own.get("top1"),
               "failed_step": failure.step if failure else "", "failure": failure.reason if failure else ""}
        if "teacher_prior" in test:  # the teacher shifted to the client's own label prior, beside the teacher
            row["teacher_prior_acc"] = test["teacher_prior"].get("top1")
        if "top5" in own:
            row.update(teacher_top5=teacher.get("top5"), client_top5=own["top5"])
        if val is not None:  # the validation split: what settings are chosen on (never the test split)
            row.update(teacher_val_acc=val.get("teacher", {}).get("top1"), client_val_acc=val.get("client", {}).get(
                "top1"))
        per_client.append(row)
    row: dict[str, Any] = {"round": rnd, "phase": outcome.phase, "num_clusters": outcome.num_clusters}
    covered = {}
    for key in ACC_KEYS:
        if any(key in r for r in per_client):
            stats = mean_sem([r.get(key) for r in per_client])  # skips None and NaN (no test samples)
            row[f"{key}_mean"], row[f"{key}_sem"] = (stats["mean"], stats["sem"]) if stats["n"] else (None, None)
            covered[key] = stats["n"]
    row.update(outcome.comm)
    row["failed_clients"] = len(failed)
    head = "teacher" if scored == "teacher" and row.get("teacher_acc_mean") is not None else "client"
    row["personalized_acc_mean"], row["personalized_acc_sem"] = row[f"{head}_acc_mean"], row[f"{head}_acc_sem"]
    row["personalized_acc_clients"] = covered[f"{head}_acc"]
    if f"{head}_val_acc_mean" in row:
        row["personalized_val_acc_mean"] = row[f"{head}_val_acc_mean"]
        row["personalized_val_acc_sem"] = row[f"{head}_val_acc_sem"]
    if f"{head}_top5_mean" in row:  # M >= 20: the top-5 headline (the paper's metric for Tiny ImageNet)
        row["personalized_top5_mean"] = row[f"{head}_top5_mean"]
        row["personalized_top5_sem"] = row[f"{head}_top5_sem"]
    row.update(outcome.losses)
    return row, per_client


def round_line(row: dict[str, Any], n: int) -> str:
    """The console's line for a round's row (``n`` clients): the mean teacher and client accuracy."""
    teacher, client = ("-" if row.get(k) is None else f"{row[k]:.4f}" for k in ("teacher_acc_mean", "client_acc_mean"))
    covered = row["personalized_acc_clients"]
    note = "" if covered == n else (f" (mean over {covered} of {n} clients; the others have no score: no test "
                                    "samples, or no teacher yet)")
    return f"round {row['round']} ({row['phase']}): teacher h_pi(i) {teacher}  client f_i {client}{note}"


def summarize_run(record: RunRecord, algorithm: Any, headline_metric: str, comm: Any) -> dict[str, Any]:
    """The run's summary: the headline (final round), the best round (by ``headline_metric``, ``top1`` or
    ``top5``; reported beside final, never used to select anything), round 0, clusters, communication (per round
    and total, uploads encoded per ``comm``; the protocol's bytes apart from those of models sent to be scored and
    of what nodes are sent once) and timings, for ``algorithm`` (its ``name``, ``scored`` model and teacher)."""
    rows, infos, clusters_info, extra_bytes = record.rows, record.infos, record.clusters_info, record.extra_bytes
    timer = record.timer

    def entry(row: dict[str, Any]) -> dict[str, Any]:
        out = {"round": row["round"]}
        for key in ("personalized_acc", "personalized_top5", "personalized_val_acc", *ACC_KEYS):
            if f"{key}_mean" in row:
                out[key] = {"mean": row[f"{key}_mean"], "sem": row[f"{key}_sem"]}
        out["personalized_acc"]["clients"] = row.get("personalized_acc_clients")  # clients with a defined accuracy
        return out

    federated = rows[1:]
    head = "personalized_top5_mean" if headline_metric == "top5" else "personalized_acc_mean"
    best = max(federated, key=lambda r: (-math.inf if r.get(head) is None else r[head], -r["round"]))
    name = "cluster teacher h_pi(i)" if algorithm.scored == "teacher" else "client model f_i"
    up = [r["upload_bytes_per_client"] for r in federated]
    down = [r["download_bytes_per_client"] for r in federated]
    # totals per client: with clients_per_round, a round counts for the share of clients that took part in it
    share = [r.get("clients_in_round", len(infos)) / len(infos) for r in federated]
    evaluation, setup = extra_bytes["evaluation"], extra_bytes["setup"]
    communication = {
        "upload_bytes_per_client_per_round": max(up), "download_bytes_per_client_per_round": max(down),
        "upload_bytes_per_client_total": round(sum(u * f for u, f in zip(up, share))),
        "download_bytes_per_client_total": round(sum(d * f for d, f in zip(down, share))),
        "upload_dtype": comm.upload_dtype, "top_k": comm.top_k, "rounds": record.rounds,
        "public_samples": record.public_samples, "num_classes": record.num_classes,
        "parameter_bytes_per_client": [c.parameters * 4 for c in infos],
        # beside the protocol's (the paper's Table 4 counts pseudo-labels only): the models sent to clients to be
        # scored there, and what nodes are sent once (U, the config)
        "evaluation_bytes_per_client_per_round": max(evaluation, default=0),
        "evaluation_bytes_per_client_total": sum(evaluation), "setup_bytes_per_client_total": sum(setup),
    }
    return {
        "algorithm": algorithm.name,
        "scored_model": name,
        "headline": f"final round, mean personalized {METRIC_LABEL[headline_metric]} accuracy of the {name} over "
                    "clients",
        "headline_metric": headline_metric,
        "final": entry(rows[-1]),
        "best": {**entry(best), "note": "round with the highest mean personalized accuracy; reported beside final, "
                                        "never used to select anything"},
        "local_only": {"round": 0, **{key: {"mean": rows[0][f"{key}_mean"], "sem": rows[0][f"{key}_sem"]}
                                      for key in ("client_acc", "client_top5") if f"{key}_mean" in rows[0]}},
        "clusters": {"K": clusters_info.get("K"), "b0": clusters_info.get("b0"),
                     "chosen_by": clusters_info.get("chosen_by"),
                     "assignment": clusters_info.get("assignment"),
                     "adjusted_rand_index": clusters_info.get("adjusted_rand_index"),
                     "structure": clusters_info.get("structure")},
        "communication": communication,
        "num_clients": len(infos),
        "failures": [f.as_dict() for f in record.failures],
        "backbones": {"clients": [c.backbone for c in infos], "teacher": getattr(algorithm, "teacher_backbone", None)},
        "wall_seconds": round(record.wall, 2),
        "stage_seconds": {k: round(v, 2) for k, v in timer.seconds.items()},
        "round_seconds": {str(k): round(v, 2) for k, v in record.round_seconds.items()},
        "stage_seconds_by_round": {r: {k: round(v, 2) for k, v in st.items()} for r, st in timer.by_round.items()},
    }


def structure_columns(info: Optional[dict[str, Any]]) -> dict[str, Any]:
    """metrics.csv's columns for how clear the clustering is (:class:`cosmos_pl.clustering.Structure`): the
    silhouette, the farthest within-cluster and nearest between-cluster distances, and ``cluster_weak`` (1 or 0);
    none for an algorithm that reports no structure."""
    st = (info or {}).get("structure")
    if not st:
        return {}
    return {"cluster_silhouette": st["silhouette"], "cluster_within_max": st["within_max"],
            "cluster_between_min": st["between_min"], "cluster_weak": int(bool(st["weak"]))}


def with_adjusted_rand_index(info: dict[str, Any], groups: Optional[list[int]]) -> dict[str, Any]:
    """clusters.json's record: the algorithm's clustering ``info`` with the true groups and the adjusted Rand
    index of its assignment against them, both None where there are no true groups (a deployment)."""
    ari = None
    if groups is not None:
        from sklearn.metrics import adjusted_rand_score

        ari = float(adjusted_rand_score(groups, info["assignment"]))
    return {**info, "true_groups": groups, "adjusted_rand_index": ari}
