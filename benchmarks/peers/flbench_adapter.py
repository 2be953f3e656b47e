"""FL-bench adapter of benchmarks/peers: run the peers' federation in FL-bench (KarhouTam/FL-bench) and write a record.

Usage::

    python benchmarks/peers/flbench_adapter.py --flbench DIR --partition PART --spec JSON \\
        --algorithm fedavg|fedmd --out RECORD.json

``DIR`` is an FL-bench checkout (written against commit 06e658bca5af6ce732e25bb7c0f8be321e14a85e); its files are
never edited and nothing is written into it. FL-bench runs in this process, serial mode, on the CPU.

Data. :func:`write_flbench_data` (numpy and pickle only, no FL-bench import) writes the partition in FL-bench's own
layout under a scratch root ``ROOT/data/<name>/``: ``data.npy`` (uint8 ``[N, C, H, W]``, every client's train images
then its test images, client after client), ``targets.npy`` (int64 ``[N]``), ``partition.pkl`` (``separation``:
every client is a train, val and test client, as FL-bench's ``split: sample`` makes it; ``data_indices[i]``:
``train`` / ``val`` (empty) / ``test`` index arrays into ``data.npy``) and ``args.json`` (``split: sample``), as
``generate_data.py`` would; and U as ``ROOT/data/<public name>/data.npy`` with zero targets (FedMD never reads
them). FL-bench reads exactly these indices (no re-split, no validation split, client i = ``client_i``);
:func:`client_views` reads them back the way FL-bench indexes them. The scratch root is a temporary folder removed
afterwards (``--keep-data DIR`` keeps it).

What is patched in-process (FL-bench's modules are imported with ``DIR`` on ``sys.path``; no file is changed):

* ``FLBENCH_ROOT`` in ``src.server.fedavg`` and ``src.server.fedmd``: the scratch root, so ``data/<name>/...`` is
  read from there instead of ``DIR/data``.
* ``HydraConfig`` in ``src.server.fedavg``: a stub giving an output dir in the scratch root (the server asks for
  it even when nothing is saved; no hydra run is started). The config itself is composed with hydra's compose API
  from ``DIR/config/defaults.yaml`` plus overrides, then passed through FL-bench's ``parse_args`` and pruned as
  ``main.py`` does.
* ``Console`` in ``src.server.fedavg``: quiet unless ``--verbose`` (FL-bench prints its whole config and tables).
* ``DATASETS``: two dataset classes (the federation, U) reading the scratch files; ``DATA_MEAN`` / ``DATA_STD``:
  ``[0.5]`` / ``[0.5]`` for them, so FL-bench's own transform (``x / 255`` in ``BaseDataset``, then
  ``Normalize``) is exactly :func:`spec.normalize` (FL-bench's fmnist statistics are 0.286 / 0.3205).
* ``MODELS``: the backbone of :func:`spec.make_model` wrapped as a ``DecoupledModel`` (``base`` = the backbone with
  its classifier replaced by ``Identity``, ``classifier`` = that classifier; same parameters, same forward).
* The server class is subclassed (not edited) to count payload bytes (``package``, the serial worker's
  ``train``), stamp each round's end and capture each client's test accuracy (the worker's ``test``).
* FedMD only, unless ``--no-fedmd-fixes``: two bugs of FL-bench's FedMD are worked around (see ``FEDMD_FIXES``).

Evaluation: every round, after aggregation, FL-bench's own ``test_client_models`` (``common.test.client.interval =
1``) scores every client's scored model (FedAvg: the global model; FedMD: its personal model) on its whole test
set; FL-bench's client-side before/after evaluations inside training are off (``client_side_evaluation = false``),
so one evaluation per client per round, as in the other systems.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

try:
    from spec import Spec, load_partition, make_model, versions, write_record
except ImportError:  # imported as benchmarks.peers.flbench_adapter
    from benchmarks.peers.spec import Spec, load_partition, make_model, versions, write_record

__all__ = ["DATASET_NAME", "PUBLIC_NAME", "write_flbench_data", "client_views", "run", "main"]

DATASET_NAME = "cosmos_peers"  # FL-bench dataset (and model) name of the federation
PUBLIC_NAME = "cosmos_peers_public"  # FL-bench dataset name of U (FedMD's public set)

FEDMD_FIXES = [
    "FL-bench FedMD never stores a client's trained model: clients return it as regular_model_params, FedMDServer "
    "neither aggregates nor keeps them (only personal_model_params, empty here, are kept), so every round every "
    "client restarts from the initial weights and test_client_models scores the untrained model. Fix: after each "
    "round the server keeps each client's returned parameters as its personal model (as FL-bench's LocalServer does).",
    "FL-bench FedMD appends public_batch_num new public batches to server.public_data every round and never clears "
    "it, so the server scores all clients on all batches so far (cost and payload grow with the round) while "
    "clients digest only the first public_batch_num batches (round 1's) every round. Fix: public_data is emptied "
    "before each round, so each round scores and digests one fresh pass over U.",
]


# ------------------------------------------------------------------------------------------------------------------
# Data layout (no FL-bench import)
# ------------------------------------------------------------------------------------------------------------------

def write_flbench_data(partition_dir: str | Path, dest: str | Path) -> Path:
    """Write an ``export-partition`` folder in FL-bench's data layout under ``dest/data/`` (see the module docstring).

    Args:
        partition_dir: a ``cosmos-pl export-partition`` folder.
        dest: the scratch root FL-bench's ``FLBENCH_ROOT`` is pointed at; created if missing.

    Returns:
        ``dest/data/DATASET_NAME``, the federation's FL-bench dataset folder.
    """
    clients, public, classes = load_partition(partition_dir)
    root = Path(dest) / "data" / DATASET_NAME
    root.mkdir(parents=True, exist_ok=True)
    images, targets, data_indices = [], [], []
    offset = 0
    for c in clients:
        n_train, n_test = len(c.y_train), len(c.y_test)
        images += [c.x_train, c.x_test]
        targets += [c.y_train, c.y_test]
        data_indices.append({"train": np.arange(offset, offset + n_train, dtype=np.int64),
                             "val": np.array([], dtype=np.int64),
                             "test": np.arange(offset + n_train, offset + n_train + n_test, dtype=np.int64)})
        offset += n_train + n_test
    np.save(root / "data.npy", np.concatenate(images).astype(np.uint8))
    np.save(root / "targets.npy", np.concatenate(targets).astype(np.int64))
    ids = list(range(len(clients)))
    # split "sample": every client trains, validates (empty set) and tests, as generate_data.py --split sample makes
    partition = {"separation": {"train": ids, "val": ids, "test": ids, "total": len(ids)}, "data_indices": data_indices}
    with open(root / "partition.pkl", "wb") as f:
        pickle.dump(partition, f)
    args = {"client_num": len(ids), "test_ratio": None, "val_ratio": 0.0, "seed": None, "split": "sample",
            "IID_ratio": None, "monitor_window_name_suffix": f"{DATASET_NAME}-{len(ids)}clients",
            "classes": classes, "source": str(Path(partition_dir).resolve())}
    (root / "args.json").write_text(json.dumps(args, indent=1))

    public_root = Path(dest) / "data" / PUBLIC_NAME
    public_root.mkdir(parents=True, exist_ok=True)
    np.save(public_root / "data.npy", public.astype(np.uint8))
    # FL-bench's datasets need targets; FedMD's server discards them (``x, _ = next(...)``)
    np.save(public_root / "targets.npy", np.zeros(len(public), dtype=np.int64))
    (public_root / "args.json").write_text(json.dumps({"classes": classes}, indent=1))
    return root


def client_views(dest: str | Path) -> list[tuple[int, int, tuple[int, ...]]]:
    """What FL-bench is fed, per client in id order: ``(n_train, n_test, sorted classes present in train)``.

    Read from the files :func:`write_flbench_data` wrote under ``dest``, indexed as FL-bench does
    (``partition["data_indices"][i]["train" | "test"]`` into ``targets.npy``, clients ``range(separation.total)``).

    Raises:
        ValueError: a client has a validation set (FL-bench would score or tune on it).
    """
    root = Path(dest) / "data" / DATASET_NAME
    with open(root / "partition.pkl", "rb") as f:
        partition = pickle.load(f)
    targets = np.load(root / "targets.npy")
    views = []
    for i in range(partition["separation"]["total"]):
        idx = partition["data_indices"][i]
        if len(idx["val"]):
            raise ValueError(f"client {i} has {len(idx['val'])} validation samples")
        views.append((len(idx["train"]), len(idx["test"]),
                      tuple(sorted(int(c) for c in np.unique(targets[idx["train"]])))))
    return views


# ------------------------------------------------------------------------------------------------------------------
# FL-bench, in-process
# ------------------------------------------------------------------------------------------------------------------

def tensor_bytes(obj) -> int:
    """Bytes of every torch tensor in ``obj`` (nested dicts, lists, tuples); anything else counts 0."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class _Recorder:
    """Per-round payload bytes, round end times and per-client test accuracy, filled by the server subclass."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.train_start_unix: float | None = None
        self.round_end_unix: list[float] = []
        # bytes[round][phase "train" | "test"][direction "down" | "up"][package key] -> bytes
        self.bytes = [{p: {"down": {}, "up": {}} for p in ("train", "test")} for _ in range(rounds)]
        self.accuracy: list[dict[int, float]] = [{} for _ in range(rounds)]

    def count(self, rnd: int, phase: str, direction: str, package: dict) -> None:
        slot = self.bytes[rnd][phase][direction]
        for key, value in package.items():
            slot[key] = slot.get(key, 0) + tensor_bytes(value)

    def total(self, rnd: int, phase: str, keys=None) -> int:
        return sum(b for d in self.bytes[rnd][phase].values() for k, b in d.items() if keys is None or k in keys)


def _import_flbench(flbench: Path, scratch: Path, verbose: bool):
    """Import FL-bench's modules from ``flbench`` and apply the in-process patches of the module docstring."""
    import functools

    if str(flbench) not in sys.path:
        sys.path.insert(0, str(flbench))
    import src.server.fedavg as fedavg_mod
    import src.server.fedmd as fedmd_mod
    from data.utils.datasets import DATASETS, BaseDataset
    from src.utils.constants import DATA_MEAN, DATA_STD
    from src.utils.models import MODELS

    loaded = Path(fedavg_mod.__file__).resolve()
    if not loaded.is_relative_to(flbench.resolve()):
        raise RuntimeError(f"FL-bench's src.server.fedavg was imported from {loaded}, not from {flbench}")
    for mod in (fedavg_mod, fedmd_mod):
        mod.FLBENCH_ROOT = scratch
    out_dir = str(scratch / "out")
    fedavg_mod.HydraConfig = SimpleNamespace(get=lambda: SimpleNamespace(runtime=SimpleNamespace(output_dir=out_dir)))
    if not verbose:
        fedavg_mod.Console = functools.partial(fedavg_mod.Console, quiet=True)

    class _ScratchDataset(BaseDataset):
        """``root/data.npy`` (uint8 ``[N, C, H, W]``) and ``root/targets.npy``; BaseDataset divides by 255."""

        def __init__(self, root, args=None, test_data_transform=None, test_target_transform=None,
                     train_data_transform=None, train_target_transform=None):
            import torch

            root = Path(root)
            data = torch.from_numpy(np.load(root / "data.npy")).float()
            if data.max() <= 1.0:  # BaseDataset would skip its /255 and the normalization would differ
                raise ValueError(f"{root}: images with max <= 1 are not scaled by FL-bench")
            classes = json.loads((root / "args.json").read_text())["classes"]
            super().__init__(data=data, targets=torch.from_numpy(np.load(root / "targets.npy")).long(),
                             classes=list(range(len(classes))), test_data_transform=test_data_transform,
                             test_target_transform=test_target_transform, train_data_transform=train_data_transform,
                             train_target_transform=train_target_transform)

    for name in (DATASET_NAME, PUBLIC_NAME):
        DATASETS[name] = _ScratchDataset
        DATA_MEAN[name], DATA_STD[name] = [0.5], [0.5]  # (x / 255 - 0.5) / 0.5, as spec.normalize
    return fedavg_mod, fedmd_mod, MODELS


def _register_model(MODELS, spec: Spec, num_classes: int, in_chans: int, image_size: int) -> None:
    """``MODELS[DATASET_NAME]``: :func:`spec.make_model` as a ``DecoupledModel`` (built when FL-bench calls it, i.e.
    right after its ``fix_random_seed(seed)``, so the weights are those of ``torch.manual_seed(seed)`` + make_model)."""
    import torch.nn as nn
    from src.utils.models import DecoupledModel

    class PeersModel(DecoupledModel):
        def __init__(self, dataset=None, pretrained=False):
            super().__init__()
            net = make_model(spec, num_classes, in_chans, image_size)
            head = net.get_classifier() if hasattr(net, "get_classifier") else None
            head_name = next((n for n, m in net.named_children() if m is head), None)
            if head_name is None:  # no separable head: the whole net is the base
                self.base, self.classifier = net, nn.Identity()
            else:
                # timm's forward_head returns the pooled features when its classifier is Identity
                setattr(net, head_name, nn.Identity())
                self.base, self.classifier = net, head

    MODELS[DATASET_NAME] = PeersModel


def _compose_config(flbench: Path, algorithm: str, spec: Spec, get_hyperparams, public_n: int):
    """FL-bench's config as ``main.py`` builds it: hydra compose of ``config/defaults.yaml`` + overrides, then its
    ``parse_args`` and the pruning of unused groups."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from src.utils.functional import parse_args

    overrides = [
        f"method={algorithm}", f"dataset.name={DATASET_NAME}", f"model.name={DATASET_NAME}",
        "model.use_torchvision_pretrained_weights=false", "model.external_model_weights_path=null",
        "optimizer.name=adam", f"optimizer.lr={spec.lr!r}", "optimizer.weight_decay=0", "optimizer.amsgrad=false",
        "lr_scheduler.name=null", "mode=serial",
        f"common.seed={spec.seed}", "common.join_ratio=1.0", f"common.global_epoch={spec.rounds}",
        f"common.local_epoch={spec.local_epochs}", f"common.batch_size={spec.batch_size}",
        "common.reset_optimizer_on_global_epoch=true", "common.straggler_ratio=0", "common.buffers=global",
        # one evaluation per client per round: FL-bench's test_client_models after aggregation, not its
        # client-side before/after-training evaluations
        "common.client_side_evaluation=false", "common.test.client.interval=1", "common.test.client.finetune_epoch=0",
        "common.test.client.train=false", "common.test.client.val=false", "common.test.client.test=true",
        "common.test.server.interval=-1", f"common.verbose_gap={spec.rounds + 1}", "common.monitor=null",
        "common.use_cuda=false", "common.save_log=false", "common.save_model=false",
        "common.save_learning_curve_plot=false", "common.save_metrics=false", "common.delete_useless_run=false",
    ]
    if algorithm == "fedmd":
        overrides += [f"+fedmd.digest_epoch={spec.digest_epochs}", f"+fedmd.public_dataset={PUBLIC_NAME}",
                      f"+fedmd.public_batch_size={spec.batch_size}",
                      f"+fedmd.public_batch_num={math.ceil(public_n / spec.batch_size)}"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(flbench / "config"), version_base=None):
        config = compose(config_name="defaults", overrides=overrides)
    config = parse_args(config, algorithm, get_hyperparams)
    keep = ["dataset", "model", "method", "common", "mode", "parallel", "optimizer", "lr_scheduler", config.method]
    for group in list(config.keys()):
        if group not in keep:
            delattr(config, group)
    return config


def _server_class(base, recorder: _Recorder, fedmd_fixes: bool):
    """``base`` (FedAvgServer or FedMDServer) with the accounting hooks (and FedMD's fixes)."""

    class Server(base):
        def __init__(self, args):
            super().__init__(args)
            self.train_progress_bar = range(self.args.common.global_epoch)  # rich's bar draws on the terminal
            self._client_packages = {}
            worker = self.trainer.worker  # serial mode: the one client object every client id runs in
            worker_train, worker_test = worker.train, worker.test

            def train(server_package):
                package = worker_train(server_package)
                recorder.count(self.current_epoch, "train", "up", package)
                self._client_packages[server_package["client_id"]] = package
                return package

            def test(server_package):
                results = worker_test(server_package)
                recorder.count(self.current_epoch, "test", "up", results)
                m = results["before"]["test"]  # "before" fine-tuning; finetune_epoch is 0
                recorder.accuracy[self.current_epoch][server_package["client_id"]] = m.corrects / m.size
                return results

            worker.train, worker.test = train, test

        def package(self, client_id):
            package = super().package(client_id)
            recorder.count(self.current_epoch, "test" if self.testing else "train", "down", package)
            return package

        def train(self):
            recorder.train_start_unix = time.time()
            super().train()

        def train_one_round(self):
            self._client_packages = {}
            if fedmd_fixes:
                self.public_data = []
            super().train_one_round()
            if fedmd_fixes:
                for client_id, package in self._client_packages.items():
                    self.clients_personal_model_params[client_id].update(package["regular_model_params"])

        def display_metrics(self):  # the last step of FL-bench's round loop, after test_client_models
            super().display_metrics()
            recorder.round_end_unix.append(time.time())

    Server.__name__ = Server.__qualname__ = base.__name__  # FL-bench derives names from the class name
    return Server


def _git_commit(flbench: Path) -> tuple[str, list[str]]:
    """``(HEAD sha, paths git reports as changed)`` of the checkout, ``("unknown", [])`` without git."""
    try:
        sha = subprocess.run(["git", "-C", str(flbench), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(flbench), "status", "--porcelain"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        return sha, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", []


def run(flbench: str | Path, partition: str | Path, spec: Spec, algorithm: str, out: str | Path,
        keep_data: str | Path | None = None, fedmd_fixes: bool = True, verbose: bool = False) -> dict:
    """Run ``algorithm`` ("fedavg" | "fedmd") of FL-bench on the partition and write the record to ``out``.

    Returns:
        The record as written.
    """
    import torch

    if algorithm not in ("fedavg", "fedmd"):
        raise ValueError(f"algorithm must be fedavg or fedmd, got {algorithm!r}")
    flbench = Path(flbench).resolve()
    torch.set_num_threads(spec.threads)
    scratch = Path(keep_data) if keep_data else Path(tempfile.mkdtemp(prefix="flbench_peers_"))
    try:
        write_flbench_data(partition, scratch)
        clients, public, classes = load_partition(partition)
        n_clients = len(clients)
        _, in_chans, image_size, _ = clients[0].x_train.shape
        fedavg_mod, fedmd_mod, MODELS = _import_flbench(flbench, scratch, verbose)
        _register_model(MODELS, spec, len(classes), int(in_chans), int(image_size))
        base = fedavg_mod.FedAvgServer if algorithm == "fedavg" else fedmd_mod.FedMDServer
        fixes = fedmd_fixes and algorithm == "fedmd"
        config = _compose_config(flbench, algorithm, spec, getattr(base, "get_hyperparams", None), len(public))
        recorder = _Recorder(spec.rounds)
        server = _server_class(base, recorder, fixes)(args=config)
        server.run_experiment()
        # get_client_optimizer_cls rewrote args.optimizer to what Adam was given
        optimizer_args = {k: (list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v)
                          for k, v in server.args.optimizer.items()}
    finally:
        if not keep_data:
            shutil.rmtree(scratch, ignore_errors=True)

    last = spec.rounds - 1
    client_accuracy = [recorder.accuracy[last][i] for i in range(n_clients)]
    model_keys = ("regular_model_params", "personal_model_params", "model_params_diff")
    payload_keys = model_keys + ("consensus",)
    sha, dirty = _git_commit(flbench)
    notes = [
        "bytes_per_round: last round's training and evaluation exchanges, every torch tensor in FL-bench's packages "
        "(server->client package of each client + client->server package), which includes Adam's state "
        "(optimizer_state) both ways and, for FedMD, the public images (public_data) and consensus; per-key "
        "breakdown in bytes_breakdown; model-only and algorithm-payload-only totals in bytes_per_round_model / "
        "bytes_per_round_payload",
        "evaluation: every round after aggregation FL-bench's test_client_models sends each client a package again "
        "(counted apart, bytes_per_round_eval) and scores its model on its whole test set (batch_size, eval mode); "
        "client_side_evaluation is off so no before/after evaluation runs inside training",
        "client order: FL-bench samples a random permutation of all clients each round (join_ratio 1); serial mode "
        "trains them one after another in one client object",
        "BN: buffers=global turns every BatchNorm buffer (running_mean, running_var, num_batches_tracked as float) "
        "into a requires_grad=False Parameter, so they are sent and sample-weighted averaged like weights",
        "optimizer: Adam built once per client object, its initial state reloaded at each client's turn "
        "(reset_optimizer_on_global_epoch), i.e. a new optimizer per round; Adam args " + json.dumps(optimizer_args),
        "training: DataLoader shuffle=True, drop_last=False, batches of <= 1 sample skipped (cosmos-pl drops a last "
        "batch of 1: same); no augmentation; normalization (x/255-0.5)/0.5 via FL-bench's own Normalize",
        "init: torch.manual_seed(seed) (FL-bench's fix_random_seed) right before the model is built",
    ]
    if algorithm == "fedmd":
        notes += [
            f"FedMD public set: U ({len(public)} images, labels faked as 0 and unused), public_batch_size "
            f"{spec.batch_size}, public_batch_num {math.ceil(len(public) / spec.batch_size)} (one pass over U per "
            "round), digest_epoch " + str(spec.digest_epochs) + ", revisit = local_epoch " + str(spec.local_epochs),
            "FedMD vs cosmos-pl: consensus = mean over clients of raw LOGITS (not softmax), computed by the SERVER "
            "from each client's stored parameters in eval mode (cosmos-pl: clients upload softmax pseudo-labels, "
            "server takes their mean); digest loss = MSELoss (mean over batch x classes) between the client's logits "
            "and the consensus logits (cosmos-pl: KL batchmean to the mean softmax); digest batches are the "
            "server's batches sent in the package, in model.train() mode, with the SAME Adam optimizer (state "
            "kept) as the revisit that follows (cosmos-pl: a separate distill optimizer); every client starts "
            "from the same seeded initial weights; the server also sends the global (never-updated) initial model "
            "in each package, overwritten by the personal one",
            "FedMD fixes applied in-process: " + (" | ".join(FEDMD_FIXES) if fixes else "none (--no-fedmd-fixes)"),
        ]
    extra = {
        "versions": versions("torch", "torchvision", "timm", "numpy", "hydra-core", "omegaconf", "pandas",
                             "scikit-learn", "rich", "ray", "pynvml", "cosmos-pl"),
        "flbench_commit": sha,
        "flbench_dirty_paths": dirty,
        "flbench_fedmd_fixes": fixes,
        "train_start_unix": recorder.train_start_unix,
        "round_client_accuracy": [[r[i] for i in range(n_clients)] for r in recorder.accuracy],
        "bytes_per_round_list": [recorder.total(r, "train") for r in range(spec.rounds)],
        "bytes_per_round_model": recorder.total(last, "train", model_keys),
        "bytes_per_round_payload": recorder.total(last, "train", payload_keys),
        "bytes_per_round_eval": recorder.total(last, "test"),
        "bytes_breakdown": recorder.bytes[last],
        "notes": notes,
    }
    write_record(out, system="FL-bench", algorithm=algorithm, round_end_unix=recorder.round_end_unix,
                 client_accuracy=client_accuracy,
                 bytes_per_round=recorder.total(last, "train") + recorder.total(last, "test"),
                 payload_bytes_per_round=recorder.total(last, "train", payload_keys), extra=extra)
    return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flbench", required=True, help="FL-bench checkout (not written to)")
    parser.add_argument("--partition", required=True, help="cosmos-pl export-partition folder")
    parser.add_argument("--spec", required=True, help="Spec(...).to_json() text")
    parser.add_argument("--algorithm", required=True, choices=["fedavg", "fedmd"])
    parser.add_argument("--out", required=True, help="record JSON to write")
    parser.add_argument("--keep-data", default=None, help="write FL-bench's data layout here and keep it")
    parser.add_argument("--no-fedmd-fixes", action="store_true", help="run FL-bench's FedMD exactly as it is")
    parser.add_argument("--verbose", action="store_true", help="let FL-bench print")
    args = parser.parse_args(argv)
    spec = Spec.from_json(args.spec)
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
    run(args.flbench, args.partition, spec, args.algorithm, args.out, keep_data=args.keep_data,
        fedmd_fixes=not args.no_fedmd_fixes, verbose=args.verbose)


if __name__ == "__main__":
    main()
