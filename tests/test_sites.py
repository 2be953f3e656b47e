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

from cosmos_pl.cli import main  # noqa: E402
from cosmos_pl.fit import run_fit  # noqa: E402
from cosmos_pl.parsers import build_fit_parser  # noqa: E402
from cosmos_pl.data import load_public  # noqa: E402
from cosmos_pl.federated.server_data import ServerData  # noqa: E402
from cosmos_pl.flower.client_app import HANDLERS, respond  # noqa: E402
from cosmos_pl.flower.replies import read_reply  # noqa: E402
from cosmos_pl.flower.server import FlowerClients  # noqa: E402

# its module fixture is made once, on one worker (`pytest --dist loadgroup`, as `make test` runs it)
pytestmark = pytest.mark.xdist_group("sites")

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

    def send(self, message_type, contents, timeout=None):
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
    transport = functools.partial(_LocalFlowerClients, grid=_Nodes(contexts), mode="deployment")
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


def _tensors(root, seen=None, depth=0):
    """Every tensor reachable from ``root`` through attributes, dicts, lists, tuples and sets (the server's state)."""
    seen = set() if seen is None else seen
    if id(root) in seen or depth > 12:
        return []
    seen.add(id(root))
    if isinstance(root, torch.Tensor):
        return [root]
    if isinstance(root, torch.nn.Module):
        return [t for t in root.state_dict().values()] + _tensors(vars(root), seen, depth + 1)
    if isinstance(root, dict):
        items = list(root.values())
    elif isinstance(root, (list, tuple, set, frozenset)):
        items = list(root)
    elif hasattr(root, "__dict__") and not isinstance(root, type) and type(root).__module__.startswith("cosmos_pl"):
        items = list(vars(root).values())
    else:
        return []
    return [t for item in items for t in _tensors(item, seen, depth + 1)]


def test_the_server_side_holds_no_client_tensor_after_a_round(exported, tmp_path):
    """A deployment's round loop, after round 1: among every tensor it holds (U, the teachers, targets), none is a
    client's data nor a client's model weights."""
    from rich.console import Console

    from cosmos_pl.runs.recorder import Recorder
    from cosmos_pl.federated.runner import Runner, RunSettings

    parser = build_fit_parser()
    init = parser.instantiate(parser.parse_args(["--config", str(CONFIG), *FLAGS, "--clients.pretrain_epochs", "1",
                                                 "--algorithm.init_args.ptc_epochs", "1"]))
    contexts = {100 + i: _site(100 + i, exported / f"client_{i}", tmp_path / f"node_{i}", i) for i in range(3)}
    transport = functools.partial(_LocalFlowerClients, grid=_Nodes(contexts), mode="deployment", config_yaml=parser.dump(
        parser.parse_args(["--config", str(CONFIG), *FLAGS, "--clients.pretrain_epochs", "1",
                           "--algorithm.init_args.ptc_epochs", "1"]), skip_unset=False), num_clients=3)
    runner = Runner(ServerData(*load_public(exported / "public.npz")), init.algorithm, init.clients,
                    RunSettings(rounds=1, seed=init.seed, trainer=init.trainer, executor=init.executor),
                    console=Console(quiet=True), recorder=Recorder(), transport=transport)
    runner.pretrain()
    runner.evaluate(0, "local-only")
    runner.evaluate(1, "PTC", runner.train_round(1))
    held = _tensors(runner)
    assert any(t.shape == runner.public.shape for t in held)  # U is the server's
    private = []
    for i in range(3):
        with np.load(exported / f"client_{i}" / "data.npz") as z:
            private += [torch.from_numpy(z[k]) for k in ("x_train", "x_test")]
        saved = torch.load(next((tmp_path / f"node_{i}").glob("*/client_*.pt")), weights_only=True)["model"]
        private += [t for t in saved.values() if t.is_floating_point() and t.numel() > 16]
    for t in held:
        for p in private:
            assert not (t.shape == p.shape and t.dtype == p.dtype and torch.equal(t, p)), (t.shape, t.dtype)


def _client_folder(folder, classes):
    folder.mkdir()
    np.savez(folder / "data.npz", x_train=np.zeros((2, 1, 2, 2), np.uint8), y_train=np.array([0, 1]),
             x_test=np.zeros((2, 1, 2, 2), np.uint8), y_test=np.array([0, 1]), classes=classes)


def test_a_missing_client_folder_is_named(tmp_path):
    from cosmos_pl.data import SiteFolders
    from cosmos_pl.errors import ConfigError

    root = tmp_path / "export"  # an export's layout: U, and client folders 0, 1, 2, 4, 5 (client_3 lost)
    root.mkdir()
    classes = np.array(["a", "b"])
    np.savez(root / "public.npz", x_public=np.zeros((2, 1, 2, 2), np.uint8), classes=classes)
    for i in (0, 1, 2, 4, 5):
        _client_folder(root / f"client_{i}", classes)
    with pytest.raises(ConfigError) as e:
        SiteFolders(str(root)).federation(6, 0.0, 0)
    assert str(e.value) == (f"{root}: client_3 is missing (expected client_0 .. client_5 for data.num_clients=6; "
                            "it holds client_0, client_1, client_2, client_4, client_5): put the missing folder(s) "
                            "back, or export the federation again into a new folder (cosmos-pl export-partition "
                            "--out DIR)")
    with pytest.raises(ConfigError, match=r"client_3, client_6 are missing \(expected client_0 \.\. client_6 for "
                                          r"data.num_clients=7;"):
        SiteFolders(str(root)).federation(7, 0.0, 0)
    with pytest.raises(ConfigError, match=rf"^data.num_clients=3: {root} also holds client_4, client_5 \(expected "
                                          r"client_0 \.\. client_2 for data.num_clients=3\): give data.num_clients "
                                          r"6 to read every client folder, or move the others out$"):
        SiteFolders(str(root)).federation(3, 0.0, 0)
    _client_folder(root / "client_3", classes)  # put back; a folder not named client_<number> is no client's
    (root / "client_x").mkdir()
    fed = SiteFolders(str(root)).federation(6, 0.0, 0)
    assert fed.num_clients == 6 and [len(c.y) for c in fed.clients] == [2, 2, 2, 2, 2, 2]


def test_an_upload_declaring_another_shape_is_refused_before_it_is_decoded():
    import numpy as np_

    from flwr.app import Array, ArrayRecord

    from cosmos_pl.flower import wire

    honest = ArrayRecord({"values": Array(np_.zeros((269, 10), np_.float32))})
    wire.check_declared(honest, {"values": ((269, 10), "float32")})
    big = Array(dtype="float32", shape=(10**6, 10**4), stype="numpy.ndarray", data=b"\x93NUMPY")  # 40 GB declared
    with pytest.raises(ValueError, match=r"array values declared float32 \[1000000, 10000\], expected float32 "
                                         r"\[269, 10\]"):
        wire.check_declared(ArrayRecord({"values": big}), {"values": ((269, 10), "float32")})
    padded = Array(dtype="float32", shape=(269, 10), stype="numpy.ndarray", data=b"x" * (269 * 10 * 4 + 10**6))
    with pytest.raises(ValueError, match="holds 1010760 bytes, more than float32 \\[269, 10\\] needs"):
        wire.check_declared(ArrayRecord({"values": padded}), {"values": ((269, 10), "float32")})
    with pytest.raises(ValueError, match=r"arrays \['indices', 'values'\], expected \['values'\]"):
        wire.check_declared(ArrayRecord({"values": Array(np_.zeros((269, 10), np_.float32)),
                                         "indices": Array(np_.zeros(1, np_.uint8))}), {"values": ((269, 10), "float32")})


def test_no_module_below_the_round_loop_imports_it():
    """Layering: algorithms/ and training/ (and data/, models/, modules/, clustering/) never import federated/,
    cosmos_pl.cli or cosmos_pl.flower; checked on every import statement of their files."""
    import ast

    root = Path(__file__).resolve().parents[1] / "cosmos_pl"
    upward = ("cosmos_pl.federated", "cosmos_pl.cli", "cosmos_pl.flower", "cosmos_pl.compare")
    found = []
    for package in ("algorithms", "training", "data", "models", "modules", "clustering"):
        for path in (root / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith(upward)]
    assert found == []
