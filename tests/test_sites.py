"""Sites that hold their own data: export-partition, a simulation over the exported folders, and the deployment's
round loop with the nodes' handlers in this process (no Flower runtime; tests/test_flower_deployment.py runs the
real one).

- ``cosmos-pl export-partition`` writes one folder per client and U; a simulation over the folders gives the numbers
  of a simulation over the original data set (metrics.csv and clients.csv byte for byte);
- the same federation with each node given only its own folder (node config ``data``), the server U and the class
  list only (``public.npz``), gives those numbers too: the nodes score the teachers the server sends them;
- a site whose data cannot be used (a corrupted image, a class the run does not know, images of another size)
  holds its client all the same: that client fails every round with a reason that names the file or class, and
  the round goes on with the others.
"""

import csv
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the [flower] extra is not installed (make test installs it)")

from flwr.app import Context, RecordDict  # noqa: E402

from cosmos_pl.cli import build_fit_parser, main, run_fit  # noqa: E402
from cosmos_pl.data import load_public  # noqa: E402
from cosmos_pl.federated.server_data import ServerData  # noqa: E402
from cosmos_pl.flower.client_app import HANDLERS, respond  # noqa: E402
from cosmos_pl.flower.server import FlowerClients, read_reply  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_flower.yaml"
FLAGS = ["--data.num_clients", "3", "--rounds", "1", "--wandb.mode", "disabled"]


class _Nodes:
    """The nodes of a deployment as Contexts in this process: node id -> Context (its config and state)."""

    def __init__(self, contexts):
        self.contexts = contexts

    def get_node_ids(self):
        return list(self.contexts)


class _LocalFlowerClients(FlowerClients):
    """FlowerClients whose messages are answered by the ClientApp's own handlers on this process's nodes."""

    def _send(self, message_type, contents, timeout=None):
        return {n: read_reply(respond(HANDLERS[message_type], content, self.grid.contexts[n]))
                for n, content in contents.items()}


def _site(node_id, folder, state, partition):
    return Context(run_id=1, node_id=node_id, node_config={"partition-id": partition, "data": str(folder),
                                                           "state-dir": str(state), "threads": 1},
                   state=RecordDict(), run_config={})


def _deploy(run_dir, public, contexts, *flags):
    """cosmos-pl fit's path with the server's data from ``public`` and the clients on ``contexts``' nodes."""
    parser = build_fit_parser()
    cfg = parser.parse_args(["--config", str(CONFIG), *FLAGS, "--run_dir", str(run_dir), *flags])
    transport = functools.partial(_LocalFlowerClients, grid=_Nodes(contexts))
    return run_fit(cfg, parser, transport, ServerData(*load_public(public)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("sites") / "export"
    assert main(["export-partition", "--config", str(CONFIG), *FLAGS[:2], "--out", str(out)]) == 0
    return out


def _records(run_dir):
    return {name: (run_dir / name).read_text() for name in ("metrics.csv", "clients.csv")}


@pytest.mark.slow
def test_export_then_simulation_and_deployment_over_the_folders_give_the_original_numbers(exported, tmp_path):
    folders = sorted(p.name for p in exported.iterdir())
    assert folders == ["client_0", "client_1", "client_2", "partition.json", "public.npz"]
    with np.load(exported / "client_1" / "data.npz") as z:
        assert sorted(z.files) == ["classes", "x_test", "x_train", "y_test", "y_train"]

    original, folders_run, deployed = tmp_path / "original", tmp_path / "folders", tmp_path / "deployed"
    assert main(["fit", "--config", str(CONFIG), *FLAGS, "--run_dir", str(original)]) == 0
    assert main(["fit", "--config", str(CONFIG), *FLAGS, "--run_dir", str(folders_run), "--data.dataset",
                 "cosmos_pl.data.SiteFolders", "--data.dataset.root", str(exported)]) == 0
    assert _records(folders_run) == _records(original)

    contexts = {100 + i: _site(100 + i, exported / f"client_{i}", tmp_path / f"node_{i}", i) for i in range(3)}
    summary = _deploy(deployed, exported / "public.npz", contexts)
    assert _records(deployed) == _records(original)
    # the teachers were scored on the nodes, sent as their float tensors: evaluation bytes, apart from the protocol's
    teacher = torch.load(sorted((original / "checkpoints").glob("*.pt"))[-1], weights_only=True)["algorithm"]
    floats = sum(t.numel() * t.element_size() for t in teacher["teachers"][0].values() if t.is_floating_point())
    comm = summary["communication"]
    assert comm["evaluation_bytes_per_client_per_round"] == floats
    assert comm["upload_bytes_per_client_per_round"] == 269 * 10 * 4  # pseudo-labels only, as in-process
    assert comm["setup_bytes_per_client_total"] > 269 * 64  # U sent once to each site, and the config
    # a deployment knows no true groups: none is reported, none invented
    clusters = json.loads((deployed / "clusters.json").read_text())
    assert clusters["true_groups"] is None and clusters["adjusted_rand_index"] is None
    assert "groups" not in json.loads((deployed / "partition.json").read_text())
    # each node kept U by its fingerprint
    assert all((tmp_path / f"node_{i}" / "public").glob("*.pt") for i in range(3))


def _broken_sites(root, exported):
    """Three sites whose data cannot be used: a corrupted image, an unknown class, images of another size."""
    from torchvision.io import write_png

    corrupted = root / "corrupted"
    for split, cls, i in (("train", "0", 0), ("train", "1", 1), ("test", "0", 2)):
        (corrupted / split / cls).mkdir(parents=True, exist_ok=True)
        write_png(torch.zeros((1, 8, 8), dtype=torch.uint8), str(corrupted / split / cls / f"{i}.png"))
    (corrupted / "train" / "1" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n torn")
    with np.load(exported / "client_0" / "data.npz") as z:
        arrays = {k: z[k] for k in z.files}
    unknown = root / "unknown"
    unknown.mkdir()
    np.savez(unknown / "data.npz", **{**arrays, "classes": np.array([*arrays["classes"][:9], "zebra"])})
    small = root / "small"
    small.mkdir()
    np.savez(small / "data.npz", **{**arrays, "x_train": np.zeros((len(arrays["y_train"]), 1, 6, 6), np.uint8)})
    return [corrupted, unknown, small]


def test_a_site_whose_data_cannot_be_used_fails_every_round_naming_the_file_or_class(exported, tmp_path):
    broken = _broken_sites(tmp_path, exported)
    folders = [exported / f"client_{i}" for i in range(3)] + broken
    contexts = {100 + i: _site(100 + i, f, tmp_path / f"node_{i}", i) for i, f in enumerate(folders)}
    summary = _deploy(tmp_path / "run", exported / "public.npz", contexts, "--data.num_clients", "6",
                      "--clients.pretrain_epochs", "1", "--algorithm.init_args.ptc_epochs", "1")
    failures = {(f["round"], f["client"]): f["reason"] for f in summary["failures"]}
    assert sorted(failures) == [(r, c) for r in (0, 1) for c in (3, 4, 5)]  # every round; the others never
    for r in (0, 1):
        assert f"image file {broken[0]}/train/1/1.png cannot be decoded" in failures[(r, 3)]
        assert f"{broken[1]}: class 'zebra' is not one of the run's 10 classes" in failures[(r, 4)]
        assert f"{broken[2]}: its train images are torch.uint8 of C x H x W (1, 6, 6), the run's are uint8 " \
               "(1, 8, 8)" in failures[(r, 5)]
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert [r["failed_clients"] for r in rows] == ["3", "3"] and summary["final"]["round"] == 1
