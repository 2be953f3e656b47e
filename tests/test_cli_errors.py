"""User errors end in one line and exit status 2, before any data is loaded; internal faults in a traceback and 1.

Nothing here trains: every bad setting must be refused right after parsing.
"""

import pytest
import torch

from cosmos_pl.cli import main
from cosmos_pl.parsers import build_fit_parser
from cosmos_pl.config import validate_config
from cosmos_pl.errors import ConfigError, TrackingError


@pytest.fixture
def fit(repo_root, tmp_path, capsys):
    """Run ``cosmos-pl fit`` on the digits smoke config with extra flags; returns (status, stderr, run_dir)."""

    def call(*extra):
        run_dir = tmp_path / "run"
        status = main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(run_dir),
                       "--wandb.mode", "disabled", *extra])
        return status, capsys.readouterr().err, run_dir

    return call


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cosmos-pl: error: "), err
    assert "Traceback" not in err
    return lines[0]


# (flags, what the one line must contain), one bad setting each
BAD_SETTINGS = [
    (["--data.public_fraction", "0"], "data.public_fraction=0.0: must be > 0"),
    (["--data.public_fraction", "1"], "data.public_fraction=1.0: must lie in [0, 1)"),
    (["--trainer.inference_batch_size", "0"], "trainer.inference_batch_size=0: must be >= 1"),
    (["--clients.batch_size", "0"], "clients.batch_size=0: must be >= 1"),
    (["--clients.batch_size", "1"], "clients.batch_size=1: must be >= 2"),
    (["--algorithm.init_args.num_views", "0"], "algorithm.init_args.num_views=0: must be >= 1"),
    (["--algorithm.init_args.temperature", "-1"], "algorithm.init_args.temperature=-1.0: must be finite and >= 0"),
    (["--algorithm.init_args.lambda_", "-1"], "algorithm.init_args.lambda_=-1.0: must be finite and >= 0"),
    (["--algorithm.init_args.lambda_", "nan"], 'Parser key "lambda_"'),  # jsonargparse refuses nan itself
    (["--clients.pretrain_epochs", "-3"], "clients.pretrain_epochs=-3: must be >= 0"),
    (["--clients.local_epochs", "-1"], "clients.local_epochs=-1: must be >= 0"),
    (["--rounds", "0"], "rounds=0: must be >= 1"),
    (["--seed", "-1"], "seed=-1: must lie in [0, 4294967295]"),
    (["--data.num_clients", "0"], "data.num_clients=0: must be >= 1"),
    (["--data.num_clients", "3"], "data.num_clients=3: must be >= data.partitioner.init_args.num_groups=5"),
    (["--data.validation_fraction", "1.0"], "data.validation_fraction=1.0: must lie in [0, 1)"),
    (["--data.test_samples_per_client", "0"], "data.test_samples_per_client=0: must be >= 1"),
    (["--transformations.noise_radius", "-0.1"], "transformations.noise_radius=-0.1: must lie in [0, 1]"),
    (["--transformations.translate", "-1"], "transformations.translate=-1: must be >= 0"),
    (["--communication.top_k", "0"], "communication.top_k=0: must be >= 1"),
    (["--executor.devices", "0"], "executor.devices=0"),
    (["--executor.threads_per_worker", "0"], "executor.threads_per_worker=0: must be >= 1"),
    (["--executor.workers_per_device", "0"], "executor.workers_per_device=0: must be >= 1"),
    (["--algorithm.init_args.b0", "-1"], "algorithm.init_args.b0=-1.0"),
    (["--algorithm.init_args.ptc_epochs", "0"], "algorithm.init_args.ptc_epochs=0: must be >= 1"),
    (["--algorithm.init_args.teacher_backbone", "vgg17"], "algorithm.init_args.teacher_backbone='vgg17': unknown backbone"),
    (["--clients.backbones", "[resnet19]"], "clients.backbones[0]='resnet19': unknown backbone. Did you mean one of: 'resnet18'"),
    (["--clients.backbones", "[test_efficientnet, resnet18.a1_in1k]"],  # no weights are loaded: refused, not ignored
     "clients.backbones[1]='resnet18.a1_in1k': '.a1_in1k' is a timm pretrained tag, but cosmos-pl loads no "
     "pretrained weights (every backbone trains from scratch with Kaiming initialisation, as in the COSMOS paper); "
     "give the architecture alone: 'resnet18'"),
    (["--algorithm.init_args.teacher_backbone", "vgg16.tv_in1k"],
     "algorithm.init_args.teacher_backbone='vgg16.tv_in1k': '.tv_in1k' is a timm pretrained tag"),
    (["--clients.optimizer.init_args.lr", "-1"], "clients.optimizer.init_args.lr=-1.0: must be finite and > 0"),
    (["--clients.distill_optimizer.init_args.lr", "0"], "clients.distill_optimizer.init_args.lr=0.0: must be finite"),
    (["--clients.optimizer.init_args.betas", "[1.5, 0.9]"], "clients.optimizer: the optimizer rejects its init_args"),
    (["--algorithm.init_args.teacher_optimizer.init_args.lr=-1e-4"],
     "algorithm.init_args.teacher_optimizer.init_args.lr=-0.0001: must be finite and > 0"),
    (["--algorithm", "FedAvg"], "same backbone"),
    (["--algorithm", "Cosmoss"], "algorithm='Cosmoss': unknown algorithm; did you mean 'cosmos'?"),
    (["--algorithm", "COMET", "--algorithm.init_args.num_clusters", "0"], "algorithm.init_args.num_clusters=0"),
    (["--algorithm", "FedMD", "--algorithm.init_args.digest_epochs", "-1"], "algorithm.init_args.digest_epochs=-1"),
    (["--wandb.project", "a/b"], "wandb.project='a/b'"),
    (["--comparison.jobs", "0"], "comparison.jobs=0: must be >= 1"),
    (["--comparison.algorithms", "[cosmos, fedmdd]"], "comparison.algorithms='fedmdd': unknown algorithm"),
]
if not torch.cuda.is_available():
    BAD_SETTINGS.append((["--trainer.accelerator", "gpu"], "trainer.accelerator='gpu': CUDA is not available"))
BAD_SETTINGS.append((["--executor.devices", f"[{torch.cuda.device_count()}]"], "do not exist"))


@pytest.mark.parametrize("flags,expected", BAD_SETTINGS, ids=[" ".join(f) for f, _ in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_and_exit_2_before_any_data_is_loaded(fit, flags, expected):
    status, err, run_dir = fit(*flags)
    assert status == 2
    assert expected in _one_line_error(err)
    assert not run_dir.exists()  # refused before the run directory, the tracker and the data


# parse errors (jsonargparse): also one line, naming the key
PARSE_ERRORS = [
    (["--rounds", "three"], 'key "rounds"'),
    (["--algorithm.lamda", "3"], "lamda"),
    (["--trainer.precision", "8"], "trainer.precision"),
    (["--data.num_client", "5"], "--data.num_client"),  # a prefix of data.num_clients is not taken for it
]


@pytest.mark.parametrize("flags,expected", PARSE_ERRORS, ids=[" ".join(f) for f, _ in PARSE_ERRORS])
def test_a_parse_error_is_one_line_and_exit_2(fit, flags, expected):
    status, err, _ = fit(*flags)
    assert status == 2
    line = _one_line_error(err)
    assert expected in line and "cosmos-pl fit --help" in line


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    assert main(["fit", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in _one_line_error(capsys.readouterr().err)


def test_compare_checks_every_pair_like_fit_before_any_pair_runs(repo_root, tmp_path, capsys):
    cfg = str(repo_root / "configs/digits_smoke.yaml")
    out = tmp_path / "cmp"
    base = ["compare", "--config", cfg, "--algorithms", "cosmos,fedmd", "--seeds", "0", "--out", str(out)]
    assert main([*base, "--clients.batch_size", "0"]) == 2
    assert "clients.batch_size=0" in _one_line_error(capsys.readouterr().err)
    assert main([*base, "--clients.optimizer.init_args.lr", "-1"]) == 2
    assert "clients.optimizer.init_args.lr=-1.0" in _one_line_error(capsys.readouterr().err)
    assert main([*base, "--data.public_fraction", "0"]) == 2  # U is empty, but cosmos and fedmd need it
    assert "data.public_fraction=0.0" in _one_line_error(capsys.readouterr().err)
    assert main([*base[:4], "cosmos", "--seeds", "0,-1", "--out", str(out)]) == 2
    assert "--seeds=-1" in _one_line_error(capsys.readouterr().err)
    assert main([*base, "--jobs", "0"]) == 2
    assert "--jobs=0" in _one_line_error(capsys.readouterr().err)
    assert not out.exists()


def test_empty_u_is_allowed_only_for_algorithms_that_do_not_use_it(repo_root):
    parser = build_fit_parser()

    def check(algorithm):
        args = ["--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithm", algorithm,
                "--data.public_fraction", "0"]
        validate_config(parser.instantiate(parser.parse_args(args)))

    check("LocalOnly")  # no error: local training never touches U
    with pytest.raises(ConfigError, match="data.public_fraction=0.0: must be > 0: FedCT exchanges"):
        check("FedCT")


def test_non_finite_numbers_from_python_or_yaml_are_refused():
    import functools

    from cosmos_pl.algorithms import COSMOS
    from cosmos_pl.config import _check_optimizer

    with pytest.raises(ConfigError, match=r"clients.optimizer.init_args.lr=nan: must be finite and > 0"):
        _check_optimizer("clients.optimizer", functools.partial(torch.optim.SGD, lr=float("nan")))
    with pytest.raises(ConfigError, match=r"clients.optimizer.init_args.lr=inf"):
        _check_optimizer("clients.optimizer", lambda params: torch.optim.SGD(params, lr=float("inf")))
    with pytest.raises(ConfigError, match=r"algorithm.init_args.lambda_=nan"):
        COSMOS(lambda_=float("nan"))
    with pytest.raises(ConfigError, match=r"algorithm.init_args.b0=nan"):
        COSMOS(b0=float("nan"))


GPU_CONFIGS = ("cifar10.yaml", "cifar100.yaml", "cifar100_homogeneous.yaml", "emnist.yaml", "tinyimagenet.yaml")


def test_every_shipped_config_passes_validation(repo_root):
    parser = build_fit_parser()
    paths = sorted((repo_root / "configs").glob("*.yaml"))
    assert set(GPU_CONFIGS) <= {p.name for p in paths}
    for path in paths:
        gpu = path.name in GPU_CONFIGS
        init = parser.instantiate(parser.parse_args(["--config", str(path)]))
        # the paper's GPU configs ask for the GPU: without one they are refused, not run on the CPU for days
        assert (init.trainer.accelerator == "gpu") == gpu, path.name
        if gpu and not torch.cuda.is_available():
            with pytest.raises(ConfigError, match=r"^trainer.accelerator='gpu': CUDA is not available: "):
                validate_config(init)
            init = parser.instantiate(parser.parse_args(["--config", str(path), "--trainer.accelerator", "cpu"]))
        validate_config(init)  # no false alarms on real settings


def test_an_internal_fault_prints_a_traceback_and_exits_1(monkeypatch, capsys):
    def broken(argv):
        raise ValueError("not enough values to unpack (expected 2, got 1)")  # a bug, not a user's mistake

    monkeypatch.setattr("cosmos_pl.cli.run", broken)
    assert main(["fit"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: not enough values to unpack" in err
    assert err.strip().splitlines()[-1].startswith("cosmos-pl: internal error (a bug in cosmos-pl): please report it")
    assert "github.com/cosmos-pl/cosmos-pl/issues" in err


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr("cosmos_pl.cli.run", interrupted)
    assert main(["fit"]) == 130
    assert "Traceback" not in capsys.readouterr().err


# --------------------------------------------------------------------------- W&B
@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path):
    """No API key anywhere wandb looks (environment, ~/.netrc, settings files); nothing touches the network."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.chdir(tmp_path)


def test_online_without_an_api_key_is_one_line_suggesting_offline(no_wandb_login, fit):
    status, err, run_dir = fit("--wandb.mode", "online")
    assert status == 2
    line = _one_line_error(err)
    assert "wandb.mode='online'" in line and "no W&B API key" in line and "--wandb.mode offline" in line
    assert not (run_dir / "partition.json").exists()  # before the data is loaded


def test_online_without_network_is_one_line_suggesting_offline(no_wandb_login, monkeypatch, tmp_path):
    import wandb

    from cosmos_pl.tracking import INIT_TIMEOUT_S, Tracker

    seen = {}

    def unreachable(**kwargs):  # what wandb.init raises when the server cannot be reached in init_timeout
        seen.update(kwargs)
        raise wandb.errors.CommError("Run initialization has timed out after 30.0 sec.")

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(wandb, "init", unreachable)
    with pytest.raises(TrackingError, match="W&B did not start.*timed out.*--wandb.mode offline"):
        Tracker("online", tmp_path, {}, "cosmos-pl", None, None, [])
    # a short timeout instead of wandb's 90 s and retries; WANDB_INIT_TIMEOUT overrides it
    assert seen["settings"].init_timeout == INIT_TIMEOUT_S == 30
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    with pytest.raises(TrackingError, match=r"WANDB_INIT_TIMEOUT \(now 5 s\)"):
        Tracker("online", tmp_path, {}, "cosmos-pl", None, None, [])
    assert seen["settings"].init_timeout == 5


def test_version(capsys):
    import platform

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("cosmos-pl 0.1.0 (torch ") and out.endswith(f"Python {platform.python_version()})")
