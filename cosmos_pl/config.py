"""The experiment configuration: typed, documented groups that jsonargparse turns into the CLI and YAML.

Every field's docstring line becomes its ``--help`` text; unknown keys and wrong types are parse errors.
This module sits at the top of the import graph: it gathers the settings classes that live beside the code
they configure (clients, trainer, executor, communication, transformations) and adds the experiment-level ones.

Every setting is checked before any data is loaded: each group's own ranges when it is built (its
``__post_init__``, or an algorithm's ``__init__``), and what spans groups or needs torch in
:func:`validate_config`; the one check that needs the data set (``communication.top_k`` <= M) is
:func:`validate_against_data`, run right after loading, before round 0. All raise
:class:`~cosmos_pl.errors.ConfigError` naming the dotted key, the value and what is allowed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from jsonargparse import Namespace, lazy_instance

from cosmos_pl.algorithms import Algorithm, algorithm_class
from cosmos_pl.communication import CommunicationConfig
from cosmos_pl.federated.sampling import check_clients_per_round
from cosmos_pl.data import FashionMNIST, GroupDirichlet, ImageDataset, Partitioner
from cosmos_pl.errors import ConfigError, check
from cosmos_pl.training.client import ClientConfig
from cosmos_pl.execution.devices import resolve_devices
from cosmos_pl.execution.executor import ExecutorConfig
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.transforms import Transformations

__all__ = [
    "DataConfig", "ClientConfig", "CommunicationConfig", "WandbConfig", "TrainerConfig", "ExecutorConfig",
    "CompareConfig", "SlurmConfig", "Transformations", "validate_config", "validate_against_data", "check_seed",
    "gpus_in_use", "run_precision", "round0_key",
]

SEED_MAX = 2**32 - 1  # numpy and Lightning take unsigned 32-bit seeds
_BAD_PROJECT_CHARS = "/\\#?%:"  # W&B refuses project names with these (wandb_settings.validate_project)


def check_seed(key: str, seed: int) -> None:
    """Raise ConfigError unless ``0 <= seed <= 2**32 - 1``."""
    check(0 <= seed <= SEED_MAX, key, seed, f"must lie in [0, {SEED_MAX}] (seeds are unsigned 32-bit integers)")


@dataclass
class DataConfig:
    """The data set, its split among clients, and the public set U.

    Args:
        dataset: the labelled image data set (class_path: cosmos_pl.data.FashionMNIST, CIFAR10, NpzData, ...).
        partitioner: how the labelled part is split among clients (GroupDirichlet = the paper's, Dirichlet, IID).
        num_clients: N, the number of clients.
        public_fraction: fraction of the training split held out as the public unlabelled set U (paper: 0.2).
        test_samples_per_client: size of each client's test set, drawn to match its label distribution.
        max_train_samples: class-stratified subsample of the training split before anything else (None: all).
        validation_fraction: fraction of each client's data held out (stratified, seeded) as its validation set, scored every round beside the test set; settings are chosen on it, never on test accuracy (0: none).
    """

    dataset: ImageDataset = lazy_instance(FashionMNIST)
    partitioner: Partitioner = lazy_instance(GroupDirichlet)
    num_clients: int = 20
    public_fraction: float = 0.2
    test_samples_per_client: int = 1000
    max_train_samples: Optional[int] = None
    validation_fraction: float = 0.0

    def __post_init__(self) -> None:
        """Raises ConfigError for a value out of range (U empty for an algorithm that needs it: :func:`validate_config`)."""
        check(self.num_clients >= 1, "data.num_clients", self.num_clients, "must be >= 1")
        check(0 <= self.public_fraction < 1, "data.public_fraction", self.public_fraction,
              "must lie in [0, 1), > 0 for algorithms that exchange pseudo-labels on U (paper: 0.2)")
        check(self.test_samples_per_client >= 1, "data.test_samples_per_client", self.test_samples_per_client,
              "must be >= 1")
        check(self.max_train_samples is None or self.max_train_samples >= 1, "data.max_train_samples",
              self.max_train_samples, "must be >= 1, or null for the whole training split")
        check(0 <= self.validation_fraction < 1, "data.validation_fraction", self.validation_fraction,
              "must lie in [0, 1) (0: no validation split)")

    def build(self, seed: int) -> tuple[Any, Any]:
        """Load the data set and split it: ``(data, federation)``, the same on every machine for the same settings
        and ``seed`` (the server and every Flower node build it alike, each keeping what it needs).

        Raises:
            DataError / FileNotFoundError: the data set cannot be loaded (naming the file or the fix).
        """
        from cosmos_pl.data import build_federation
        from cosmos_pl.data.sites import SiteFolders

        if isinstance(self.dataset, SiteFolders):  # an exported federation: its folders are the partition
            return self.dataset, self.dataset.federation(self.num_clients, self.validation_fraction, seed)
        data = self.dataset.load()
        return data, build_federation(
            data, self.partitioner, self.num_clients, public_fraction=self.public_fraction,
            test_samples_per_client=self.test_samples_per_client, max_train_samples=self.max_train_samples,
            validation_fraction=self.validation_fraction, seed=seed)


@dataclass
class WandbConfig:
    """Weights & Biases tracking: one run per experiment, stepped by round.

    Args:
        mode: 'offline' (default: files under the run directory, sync later with `wandb sync`), 'online' or 'disabled'.
        project: W&B project name.
        entity: W&B entity (team or user); None uses your default.
        name: run name; None uses the run directory's name.
        tags: run tags.
        group: W&B run group (W&B's run table groups runs by it); `compare` sets it to the comparison's name
            (the --out folder's name, or this setting when given), with the grid point for a grid's pairs.
        job_type: W&B job type; `compare` sets it to the algorithm's short name (its table run: 'comparison').
    """

    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "cosmos-pl"
    entity: Optional[str] = None
    name: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    group: Optional[str] = None
    job_type: Optional[str] = None

    def __post_init__(self) -> None:
        """Raises ConfigError for a project name W&B rejects (found here, not when the run is synced)."""
        ok = 0 < len(self.project) <= 128 and not set(self.project) & set(_BAD_PROJECT_CHARS)
        check(ok, "wandb.project", self.project,
              f"give a name of 1 to 128 characters without any of {' '.join(_BAD_PROJECT_CHARS)}")


@dataclass
class CompareConfig:
    """What `cosmos-pl compare` runs (the `comparison` group; `cosmos-pl fit` ignores it).

    Args:
        algorithms: short names of the algorithms to compare: cosmos, local, fedmd, fedct, comet, fedavg, ditto,
            fedbabu.
        seeds: seeds; every algorithm runs once per seed, on the same partition for the same seed.
        settings: init_args per algorithm name (e.g. {comet: {num_clusters: 5}}); for cosmos the `algorithm` group is used when it is COSMOS and no entry is given here.
        jobs: pairs run side by side, the CPU cores split between them (1: one after another).
    """

    algorithms: list[str] = field(default_factory=lambda: ["cosmos", "comet", "fedct", "fedmd", "local"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: int = 1

    def __post_init__(self) -> None:
        """Raises ConfigError for an unknown algorithm name, a bad seed or jobs < 1."""
        check(len(self.algorithms) > 0, "comparison.algorithms", self.algorithms, "give at least one name")
        for name in self.algorithms:
            algorithm_class(name, "comparison.algorithms")
        for name in self.settings:
            algorithm_class(name, "comparison.settings")
        check(len(self.seeds) > 0, "comparison.seeds", self.seeds, "give at least one seed")
        for seed in self.seeds:
            check_seed("comparison.seeds", seed)
        check(self.jobs >= 1, "comparison.jobs", self.jobs, "must be >= 1")


@dataclass
class SlurmConfig:
    """The Slurm jobs of `cosmos-pl compare --launcher slurm` (the `slurm` group; submitted with submitit).

    Each pair is one job (one array per round-0 group, see cosmos_pl.compare.slurm); the resources below are per
    job. A job that Slurm pre-empts or that reaches its time limit gets `signal_delay_s` seconds' notice, stops its
    run after its last complete round and is requeued, then continues with `fit --resume`.

    Args:
        cluster: 'slurm'; or 'local' (submitit's local executor: the same jobs as processes on this machine,
            requeue included, without a scheduler; jobs wait for their round 0 here instead of by a Slurm
            dependency) or 'debug' (in this process, for a debugger).
        partition: the Slurm partition (sbatch --partition); None: the cluster's default.
        gpus_per_job: GPUs per job (sbatch --gpus-per-node); 0 for CPU-only jobs.
        cpus_per_job: CPU cores per job (sbatch --cpus-per-task); also the pair's torch threads.
        mem_gb: memory per job in GB (sbatch --mem); None: the partition's default.
        time_min: the time limit per job in minutes (sbatch --time); a job that reaches it is requeued and resumes.
        array_parallelism: how many jobs of one job array run at once (sbatch --array=...%N).
        signal_delay_s: seconds of notice before the time limit (sbatch --signal=USR2@N): enough for the pair to
            stop after its last complete round.
        max_requeues: how many times a job that reached its time limit is requeued before it is reported failed
            (pre-emptions do not count).
        sbatch: extra sbatch arguments without the dashes, e.g. {account: myproj, qos: high, constraint: a100}.
        setup: shell lines run in the job before the pair, e.g. ["module load cuda", "source .venv/bin/activate"].
        folder: where submitit keeps the jobs' scripts, pickles and Slurm logs; None: OUT/slurm.
    """

    cluster: Literal["slurm", "local", "debug"] = "slurm"
    partition: Optional[str] = None
    gpus_per_job: int = 1
    cpus_per_job: int = 8
    mem_gb: Optional[float] = None
    time_min: int = 240
    array_parallelism: int = 16
    signal_delay_s: int = 120
    max_requeues: int = 3
    sbatch: dict[str, Any] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    folder: Optional[str] = None

    def __post_init__(self) -> None:
        """Raises ConfigError for a count or time out of range."""
        check(self.gpus_per_job >= 0, "slurm.gpus_per_job", self.gpus_per_job, "must be >= 0 (0: CPU-only jobs)")
        check(self.cpus_per_job >= 1, "slurm.cpus_per_job", self.cpus_per_job, "must be >= 1")
        check(self.mem_gb is None or self.mem_gb > 0, "slurm.mem_gb", self.mem_gb, "must be > 0, or null")
        check(self.time_min >= 1, "slurm.time_min", self.time_min, "must be >= 1 (minutes)")
        check(self.array_parallelism >= 1, "slurm.array_parallelism", self.array_parallelism, "must be >= 1")
        check(0 <= self.signal_delay_s < 60 * self.time_min, "slurm.signal_delay_s", self.signal_delay_s,
              "must be >= 0 and shorter than slurm.time_min")
        check(self.max_requeues >= 0, "slurm.max_requeues", self.max_requeues, "must be >= 0")


def _check_batch_of_one(key: str, batch_size: int, backbones: list[str]) -> None:
    """BatchNorm cannot train on batches of one sample: a batch size of 1 needs backbones without it."""
    if batch_size != 1:
        return
    from cosmos_pl.models import create_backbone

    for name in dict.fromkeys(backbones):
        model = create_backbone(name, num_classes=10, in_chans=3, image_size=32)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise ConfigError(f"{key}=1: must be >= 2, since {name} has BatchNorm layers, which cannot train on a "
                              f"batch of one sample")


def _check_optimizer(key: str, factory: Any) -> None:
    """Build the optimizer on one dummy parameter, so a bad learning rate or other init_arg fails now."""
    if isinstance(factory, dict):  # a class_path/init_args dict not built by the parser
        lr = factory.get("init_args", {}).get("lr")
    else:
        lr = factory.keywords.get("lr") if isinstance(factory, functools.partial) else None
    if lr is not None:
        check(math.isfinite(float(lr)) and float(lr) > 0, f"{key}.init_args.lr", lr, "must be finite and > 0")
    if not callable(factory):
        return
    try:
        optimizer = factory([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{key}: the optimizer rejects its init_args ({err}); fix {key}.init_args") from None
    lr = optimizer.defaults.get("lr")
    if lr is not None:
        check(math.isfinite(float(lr)) and float(lr) > 0, f"{key}.init_args.lr", float(lr), "must be finite and > 0")


def gpus_in_use(executor: Any, accelerator: str) -> list[int]:
    """The visible ids of the GPUs the stages train on: those of ``executor.devices``, the first only with
    ``executor.kind`` sequential (everything in the main process); none on the CPU. ``executor``: the executor
    group, built (:class:`ExecutorConfig`) or parsed (its Namespace)."""
    gpus = [d for d in resolve_devices(executor.devices, accelerator) if d is not None]
    return gpus[:1] if executor.kind == "sequential" else gpus


def run_precision(init: Namespace) -> str:
    """Set ``init.trainer.precision`` to what the stages run in on the GPUs in use (:func:`gpus_in_use`):
    ``trainer.precision_fallback`` instead of bf16-mixed where one has no native bfloat16
    (:func:`~cosmos_pl.training.cuda_check.choose_precision`), else unchanged; returns the line that says so, or
    "". For a process that trains without ``fit``'s device line (a Flower node).

    Raises:
        ConfigError: bf16-mixed on a GPU without native bfloat16 and no ``trainer.precision_fallback``.
    """
    from cosmos_pl.execution.devices import physical_gpu
    from cosmos_pl.training.cuda_check import choose_precision, gpu_facts

    trainer = init.trainer
    gpus = gpus_in_use(init.executor, trainer.accelerator)
    if trainer.precision != "bf16-mixed" or not gpus:
        return ""
    facts, _ = gpu_facts([(g, physical_gpu(g)) for g in gpus])
    trainer.precision, note = choose_precision(trainer.precision, trainer.precision_fallback, facts)
    return note


# torch modules whose CUDA backward has no deterministic algorithm: under torch.use_deterministic_algorithms(True)
# it raises (torch.use_deterministic_algorithms' list). AdaptiveAvgPool2d to 1x1 is computed as a mean, which has
# one, so only other output sizes count.
_NONDETERMINISTIC_BACKWARD = (torch.nn.AdaptiveAvgPool2d, torch.nn.AdaptiveAvgPool3d, torch.nn.AdaptiveMaxPool2d,
                              torch.nn.AvgPool3d, torch.nn.FractionalMaxPool2d, torch.nn.FractionalMaxPool3d,
                              torch.nn.ReflectionPad1d, torch.nn.ReflectionPad2d, torch.nn.ReflectionPad3d)


def _no_deterministic_backward(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The first module of ``model`` whose CUDA backward torch cannot run deterministically; None for none."""
    for module in model.modules():
        if isinstance(module, _NONDETERMINISTIC_BACKWARD):
            size = getattr(module, "output_size", None)
            if isinstance(module, torch.nn.AdaptiveAvgPool2d) and size in (1, (1, 1), [1, 1]):
                continue
            return module
    return None


def _check_deterministic_backbones(backbones: dict[str, list[str]]) -> None:
    """With ``trainer.deterministic: true`` on a GPU, refuse a backbone (``backbones``: the names each key
    trains) that has a layer torch cannot differentiate deterministically on CUDA: its first training step would
    raise, and the client would be counted as failing."""
    from cosmos_pl.models import create_backbone

    for key, names in backbones.items():
        for name in dict.fromkeys(names):
            layer = _no_deterministic_backward(create_backbone(name, num_classes=10, in_chans=3, image_size=32))
            if layer is not None:
                raise ConfigError(
                    f"{key}: {name} has {layer}, which torch cannot train deterministically on a GPU (with "
                    f"trainer.deterministic=True its backward raises); use trainer.deterministic warn (deterministic "
                    f"wherever torch can be, with a warning at that layer), another backbone, or trainer.accelerator "
                    f"cpu")


def _check_gpus(init: Namespace, gpus: list[int]) -> None:
    """The GPUs ``gpus`` against the torch build and the trainer settings: kernels for each
    (:func:`~cosmos_pl.training.cuda_check.check_kernels`), bf16-mixed only on native bfloat16 unless
    ``trainer.precision_fallback`` (:func:`~cosmos_pl.training.cuda_check.choose_precision`), and backbones
    that ``trainer.deterministic: true`` can train."""
    from cosmos_pl.execution.devices import physical_gpu
    from cosmos_pl.training.cuda_check import check_kernels, choose_precision, gpu_facts

    trainer: TrainerConfig = init.trainer
    facts, _ = gpu_facts([(g, physical_gpu(g)) for g in gpus])
    check_kernels(facts, torch.cuda.get_arch_list(), trainer.accelerator)
    choose_precision(trainer.precision, trainer.precision_fallback, facts)
    if trainer.deterministic is True:
        backbones = {"clients.backbones": list(init.clients.backbones)}
        teacher = getattr(init.algorithm, "teacher_backbone", None)
        if teacher is not None:
            backbones["algorithm.init_args.teacher_backbone"] = [teacher]
        _check_deterministic_backbones(backbones)


def validate_config(init: Namespace) -> None:
    """Check an instantiated ``fit`` config (``parser.instantiate(cfg)``) before any data is loaded.

    Each group checked its own ranges when it was built; this checks what spans groups or needs torch, timm or
    the machine: ``rounds``, ``seed`` and ``clients_per_round``, an empty U for an algorithm that exchanges pseudo-labels on it, the
    partitioner's groups against ``data.num_clients``, backbone names, a batch of one with BatchNorm, the
    algorithm's own requirements (:meth:`Algorithm.validate`), every optimizer's init_args (built once on a
    dummy parameter), CUDA for ``trainer.accelerator`` and the GPU ids of ``executor.devices``; on the GPUs in
    use (:func:`gpus_in_use`), kernels in this torch build for each, native bfloat16 for bf16-mixed unless
    ``trainer.precision_fallback`` is set, and with ``trainer.deterministic: true`` backbones whose every layer
    torch can train deterministically there.

    Raises:
        ConfigError: naming the dotted key, the value and what is allowed.
    """
    algorithm: Algorithm = init.algorithm
    data: DataConfig = init.data
    clients: ClientConfig = init.clients
    check(init.rounds >= 1, "rounds", init.rounds, "must be >= 1 (rounds after round 0, which trains locally)")
    every = init.get("evaluate_every", 1)
    check(every == "final" or every >= 1, "evaluate_every", every, "must be >= 1 (every that many rounds) or 'final'")
    check_seed("seed", init.seed)
    check_clients_per_round(init.get("clients_per_round"), data.num_clients)
    check(data.public_fraction > 0 or not algorithm.uses_public, "data.public_fraction", data.public_fraction,
          f"must be > 0: {type(algorithm).__name__} exchanges pseudo-labels on the public set U (paper: 0.2)")
    groups = getattr(data.partitioner, "num_groups", None)
    if isinstance(groups, int):
        check(groups >= 1, "data.partitioner.init_args.num_groups", groups, "must be >= 1")
        check(data.num_clients >= groups, "data.num_clients", data.num_clients,
              f"must be >= data.partitioner.init_args.num_groups={groups}: every group needs a client; "
              f"raise num_clients or lower num_groups")
    # backbone names were checked when ClientConfig and the algorithm were built (check_backbone_name)
    _check_batch_of_one("clients.batch_size", clients.batch_size, list(clients.backbones))
    teacher = getattr(algorithm, "teacher_backbone", None)
    if teacher is not None:
        _check_batch_of_one("algorithm.init_args.teacher_batch_size", algorithm.teacher_batch_size, [teacher])
    algorithm.validate(list(clients.backbones))
    _check_optimizer("clients.optimizer", clients.optimizer)
    _check_optimizer("clients.distill_optimizer", clients.distill_optimizer)
    for name, value in vars(algorithm).items():
        if name.endswith("optimizer") and value is not None:
            _check_optimizer(f"algorithm.init_args.{name}", value)
    accelerator = init.trainer.accelerator
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        from cosmos_pl.training.cuda_check import cuda_unavailable_reason

        check(False, "trainer.accelerator", accelerator, f"CUDA is not available: {cuda_unavailable_reason()}")
    gpus = gpus_in_use(init.executor, accelerator)
    if gpus:
        _check_gpus(init, gpus)
    cache = init.get("round0_cache")
    check(not cache or not Path(cache).is_file(), "round0_cache", cache, "is an existing file; give a folder")
    check(not init.get("round0_only") or cache, "round0_only", True,
          "needs --round0_cache FOLDER (where round 0's client models are kept)")


def validate_against_data(init: Namespace, num_classes: int) -> None:
    """The checks that need the loaded data set's number of classes M; run before round 0.

    Raises:
        ConfigError: ``communication.top_k`` > M, or ``headline_metric`` top5 with M < 20.
    """
    top_k = init.communication.top_k
    check(top_k is None or top_k <= num_classes, "communication.top_k", top_k,
          f"must lie in [1, M={num_classes}] for this data set, or null for dense uploads")
    metric = init.get("headline_metric", "top1")
    check(metric != "top5" or num_classes >= 20, "headline_metric", metric,
          f"top-5 accuracy is recorded for data sets of M >= 20 classes and this one has M = {num_classes}: use top1")


def round0_key(cfg: Namespace, threads: int) -> str:
    """The settings that decide round 0 (data and partition, clients' models and pre-training, augmentation,
    numerics), as text; with what they resolved to on this machine: the device ``trainer.accelerator`` names
    (``auto`` is the GPU on one machine and the CPU on another); on the CPU ``threads``, the torch CPU threads per
    task (sums are added in another order with another thread count); on a GPU the models of the GPUs in use
    (:func:`gpus_in_use`) and the torch and cuDNN versions (whose kernels may add in another order), so a round 0
    trained elsewhere is not reused."""
    import json

    from cosmos_pl.models import BACKBONE_REVISION
    from cosmos_pl.training.config import resolve_device

    parts = {k: cfg[k] for k in ("seed", "data", "transformations", "trainer")}
    parts["backbone_revision"] = BACKBONE_REVISION  # models saved under another definition are not reused
    device = resolve_device(cfg.trainer.accelerator).type
    parts["resolved"] = {"device": device, "threads": threads if device == "cpu" else None}
    if device == "cuda":
        from cosmos_pl.execution.devices import physical_gpu
        from cosmos_pl.training.cuda_check import cudnn_version, gpu_facts

        gpus = gpus_in_use(cfg.executor, cfg.trainer.accelerator)
        _, models = gpu_facts([(g, physical_gpu(g)) for g in gpus])
        parts["resolved"].update(gpus=models, torch=torch.__version__, cudnn=cudnn_version())
    clients = cfg.clients.clone()
    del clients["local_epochs"], clients["distill_epochs"], clients["distill_optimizer"]
    parts["clients"] = clients
    return json.dumps(Namespace(parts).as_dict(), sort_keys=True, default=str)
