"""`cosmos-pl fit` on digits_smoke.yaml end to end: the run directory's files, their values, determinism."""

import csv
import json

import pytest
import yaml

from sklearn.metrics import adjusted_rand_score

from cosmos_pl.cli import main
from conftest import small_digits_argv


@pytest.fixture(scope="module")
def smoke_runs(smoke_run):
    """configs/digits_smoke.yaml as it is, trained once per pytest run (conftest's smoke_run)."""
    return [(smoke_run, json.loads((smoke_run / "summary.json").read_text()))]


@pytest.mark.slow
def test_run_directory_files(smoke_runs):
    run_dir, summary = smoke_runs[0]
    for name in ("config.yaml", "partition.json", "clusters.json", "metrics.csv", "clients.csv", "summary.json",
                 "accuracy_vs_round.png"):
        assert (run_dir / name).is_file(), name
    assert not list(run_dir.glob(".*.tmp")), "no half-written temp files are left behind"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["dataset"]["class_path"] == "cosmos_pl.data.Digits"
    rounds = config["rounds"]

    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == list(range(rounds + 1))
    assert rows[0]["phase"] == "local-only" and rows[0]["teacher_acc_mean"] == ""
    assert rows[1]["phase"] == "PTC" and all(r["phase"] == "IFFT" for r in rows[2:])

    partition = json.loads((run_dir / "partition.json").read_text())
    clients = config["data"]["num_clients"]
    assert len(partition["class_counts"]) == clients and len(partition["groups"]) == clients

    # byte counts: |U| * M * 4 bytes of float32 pseudo-labels each way per round
    n_public, m = partition["public_set_size"], partition["num_classes"]
    comm = summary["communication"]
    assert comm["upload_bytes_per_client_per_round"] == n_public * m * 4
    assert comm["download_bytes_per_client_per_round"] == n_public * m * 4
    assert int(rows[1]["upload_bytes_per_client"]) == n_public * m * 4 and int(rows[0]["upload_bytes_per_client"]) == 0


@pytest.mark.slow
def test_summary_agrees_with_metrics_and_clients(smoke_runs):
    run_dir, summary = smoke_runs[0]
    saved = json.loads((run_dir / "summary.json").read_text())
    for key in ("final", "best", "local_only", "clusters", "communication", "wall_seconds"):
        assert key in saved
    # what it trained on: digits_smoke asks for the CPU; the default executor runs there in the main process, with
    # a torch thread per core it may use
    import torch

    device = saved["device"]
    assert (device["accelerator"], device["type"], device["precision"]) == ("cpu", "cpu", "32-true")
    assert device["torch"] == torch.__version__ and device["cuda"] == torch.version.cuda
    assert device["workers"] == 0 and device["threads_per_task"] == device["cpu_cores"] >= 1
    # the determinism flags, and on the CPU no GPU, driver or cuDNN (docs/execution.md, The device a run uses)
    assert (device["deterministic"], device["benchmark"]) == (False, False)
    assert [device[k] for k in ("gpu_ids", "gpus", "capabilities", "driver", "cudnn")] == [None] * 5
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert saved["final"]["round"] == len(rows) - 1
    assert saved["final"]["teacher_acc"]["mean"] == pytest.approx(float(rows[-1]["teacher_acc_mean"]), abs=1e-6)
    assert saved["local_only"]["client_acc"]["mean"] == pytest.approx(float(rows[0]["client_acc_mean"]), abs=1e-6)
    best_row = max(rows[1:], key=lambda r: float(r["teacher_acc_mean"]))
    assert saved["best"]["teacher_acc"]["mean"] == pytest.approx(float(best_row["teacher_acc_mean"]), abs=1e-6)

    # the round mean is the mean of the per-client accuracies in clients.csv
    with open(run_dir / "clients.csv") as f:
        per_client = [r for r in csv.DictReader(f) if r["round"] == rows[-1]["round"]]
    accs = [float(r["teacher_acc"]) for r in per_client]
    assert sum(accs) / len(accs) == pytest.approx(float(rows[-1]["teacher_acc_mean"]), abs=1e-5)

    clusters = json.loads((run_dir / "clusters.json").read_text())
    assert saved["clusters"]["K"] == clusters["K"] == len(clusters["clusters"])
    assert sorted(i for c in clusters["clusters"] for i in c) == list(range(len(per_client)))
    # the ARI is recomputed from the written assignment; on digits the 5 class groups are found exactly
    ari = adjusted_rand_score(clusters["true_groups"], clusters["assignment"])
    assert saved["clusters"]["adjusted_rand_index"] == pytest.approx(ari) == pytest.approx(1.0)
    # how clear the clustering is, recomputed from the written distances and assignment: seed 0's five
    # groups are separated (farthest within a cluster < nearest between clusters) with a silhouette >= 0.25
    import numpy as np

    from cosmos_pl.clustering import structure

    st = structure(np.array(clusters["distances"]), np.array(clusters["assignment"]))
    assert clusters["structure"] == saved["clusters"]["structure"]
    assert clusters["structure"] == pytest.approx(st.as_dict(), abs=1e-5)  # clusters.json's distances have 6 digits
    assert st.separated and st.silhouette >= 0.25 and not clusters["structure"]["weak"]
    assert [r["cluster_weak"] for r in rows[1:]] == ["0"] * (len(rows) - 1) and rows[0]["cluster_weak"] == ""
    assert float(rows[1]["cluster_within_max"]) == pytest.approx(st.within_max, abs=1e-6)
    assert float(rows[1]["cluster_between_min"]) == pytest.approx(st.between_min, abs=1e-6)
    # the headline of COSMOS is the teacher: personalized accuracy = teacher accuracy in every federated round
    assert saved["scored_model"] == "cluster teacher h_pi(i)"
    assert all(r["personalized_acc_mean"] == r["teacher_acc_mean"] for r in rows[1:])
    assert rows[0]["personalized_acc_mean"] == rows[0]["client_acc_mean"]


def test_print_config_works_offline_for_every_config(repo_root, capsys):
    configs = sorted((repo_root / "configs").glob("*.yaml"))
    assert len(configs) >= 8
    for path in configs:
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", str(path), "--print_config"])
        assert exit_info.value.code == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["algorithm"]["class_path"].startswith("cosmos_pl.algorithms.")
        assert printed["data"]["dataset"]["class_path"].startswith("cosmos_pl.data.")


def test_unknown_key_and_wrong_type_name_the_key(repo_root, capsys):
    cfg = str(repo_root / "configs/digits_smoke.yaml")
    assert main(["fit", "--config", cfg, "--algorithm.lamda", "3"]) == 2
    assert "lamda" in capsys.readouterr().err
    assert main(["fit", "--config", cfg, "--rounds", "three"]) == 2
    assert "rounds" in capsys.readouterr().err


@pytest.mark.slow
def test_notebook_runs_on_the_digits_run(smoke_runs):
    from test_notebook import _execute_notebook

    run_dir, summary = smoke_runs[0]
    nb, text = _execute_notebook(run_dir)
    assert f"{summary['final']['teacher_acc']['mean']:.4f}" in text
    assert f"{summary['local_only']['client_acc']['mean']:.4f}" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 2


def test_settings_checked_after_parsing_fail_fast_with_a_clean_message(repo_root, tmp_path, capsys):
    cfg = str(repo_root / "configs/digits_smoke.yaml")
    # an impossible partition: 3 clients for 5 class groups
    assert main(["fit", "--config", cfg, "--run_dir", str(tmp_path / "p"), "--data.num_clients", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cosmos-pl: error:") and "num_clients=3" in err and "Traceback" not in err
    # a negative B0 fails before any training (no metrics.csv is written)
    assert main(["fit", "--config", cfg, "--run_dir", str(tmp_path / "b"), "--algorithm.b0", "-1"]) == 2
    assert "algorithm.init_args.b0=-1" in capsys.readouterr().err
    assert not (tmp_path / "b" / "metrics.csv").exists()
    # a top_k larger than M fails before any training too
    assert main(["fit", "--config", cfg, "--run_dir", str(tmp_path / "k"), "--communication.top_k", "11"]) == 2
    assert "top_k=11" in capsys.readouterr().err


@pytest.mark.slow
def test_stage_losses_are_recorded_every_round(smoke_runs):
    run_dir, _ = smoke_runs[0]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    lam = config["algorithm"]["init_args"]["lambda_"]
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["local_training_loss"]) > 0 and rows[0]["teacher_kl"] == ""
    for r in rows[1:]:  # PTC and IFFT: teachers (Eq. 1) and clients (Eq. 2) each log KL and r_B
        parts = {k: float(r[k]) for k in ("teacher_loss", "teacher_kl", "teacher_r_b", "client_distillation_loss",
                                          "client_distillation_kl", "client_distillation_r_b")}
        assert all(v >= 0 for v in parts.values())
        # the loss is KL + lambda * r_B, also after averaging over epochs' batches and over models (it is linear)
        assert parts["teacher_loss"] == pytest.approx(parts["teacher_kl"] + lam * parts["teacher_r_b"], rel=1e-4)
        assert parts["client_distillation_loss"] == pytest.approx(
            parts["client_distillation_kl"] + lam * parts["client_distillation_r_b"], rel=1e-4)
    assert all(float(r["local_training_loss"]) > 0 for r in rows[2:])  # IFFT's local fine-tune


@pytest.mark.slow
def test_validation_split_is_scored_every_round(repo_root, tmp_path):
    run_dir = tmp_path / "val"
    assert main(small_digits_argv(repo_root, run_dir, "--rounds", "1", "--data.validation_fraction", "0.2",
                                  # the runner path of the clients' label-prior correction runs too
                                  "--algorithm.init_args.client_prior_correction", "true")) == 0
    sizes = json.loads((run_dir / "partition.json").read_text())["validation_set_sizes"]
    assert all(n > 0 for n in sizes)
    with open(run_dir / "clients.csv") as f:
        per_client = list(csv.DictReader(f))
    for r in per_client:  # an accuracy over n validation images is k / n
        n = sizes[int(r["client"])]
        for key in ("client_val_acc", "teacher_val_acc"):
            if r[key]:
                k = float(r[key]) * n
                assert k == pytest.approx(round(k), abs=1e-3)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[1]["teacher_val_acc_mean"] != "" and rows[0]["teacher_val_acc_mean"] == ""
    vals = [float(r["teacher_val_acc"]) for r in per_client if r["round"] == "1"]
    assert sum(vals) / len(vals) == pytest.approx(float(rows[1]["teacher_val_acc_mean"]), abs=1e-5)
    assert rows[1]["personalized_val_acc_mean"] == rows[1]["teacher_val_acc_mean"]


def test_round0_cache_key_names_what_decides_round0(repo_root):
    import torch

    from cosmos_pl.config import round0_key
    from cosmos_pl.models import BACKBONE_REVISION
    from cosmos_pl.parsers import build_fit_parser

    parser = build_fit_parser()
    base = ["--config", str(repo_root / "configs/digits_smoke.yaml")]
    key = round0_key(parser.parse_args(base), 1)
    assert json.loads(key)["backbone_revision"] == BACKBONE_REVISION  # old round-0 models are never reused
    # later rounds' settings leave round 0 alone; pre-training's do not
    assert round0_key(parser.parse_args(base + ["--clients.local_epochs", "7"]), 1) == key
    assert round0_key(parser.parse_args(base + ["--clients.pretrain_epochs", "7"]), 1) != key
    # what the settings resolve to: digits_smoke trains on the CPU, where the thread count is part of the key
    assert json.loads(key)["resolved"] == {"device": "cpu", "threads": 1}
    assert round0_key(parser.parse_args(base), 2) != key
    assert round0_key(parser.parse_args(base + ["--trainer.deterministic", "true"]), 1) != key
    # accelerator auto: the CPU here, a GPU where CUDA exists (threads then do not decide the numbers; the GPU
    # models and torch and cuDNN versions do: tests/test_gpu_settings.py)
    auto = json.loads(round0_key(parser.parse_args(base + ["--trainer.accelerator", "auto"]), 1))["resolved"]
    if torch.cuda.is_available():
        assert (auto["device"], auto["threads"], auto["torch"]) == ("cuda", None, torch.__version__)
    else:
        assert auto == {"device": "cpu", "threads": 1}


@pytest.mark.slow
def test_evaluate_every_final_scores_round_0_and_the_last_round_only(repo_root, tmp_path, small_digits_run):
    # scoring draws no random numbers and changes no model: rounds 0 and 2 are the every-round run's own rows, and
    # round 1 has no accuracy (empty, not 0)
    run_dir = tmp_path / "final_only"
    assert main(small_digits_argv(repo_root, run_dir, "--evaluate_every", "final")) == 0
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    every = list(csv.DictReader((small_digits_run / "metrics.csv").open()))
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    assert rows[0] == every[0] and rows[2] == every[2]
    accuracy = [k for k in rows[1] if k.endswith("_acc_mean") or k.endswith("_acc_sem")]
    assert accuracy and all(rows[1][k] == "" for k in accuracy), {k: rows[1][k] for k in accuracy}
    # and each client's scores of rounds 0 and 2 too: the same config and seed give the same numbers, here in this
    # process against the run that another process (or worker) made for the whole pytest run
    clients = [r for r in csv.DictReader((run_dir / "clients.csv").open()) if r["round"] != "1"]
    assert clients == [r for r in csv.DictReader((small_digits_run / "clients.csv").open()) if r["round"] != "1"]
    assert rows[1]["upload_bytes_per_client"] == every[1]["upload_bytes_per_client"]
