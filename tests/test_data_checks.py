"""Bad data and bad partitions are refused up front, and undefined accuracies are never averaged as 0.

Each data set is checked on load (``check_image_data``), each federation before any training (every client
and a non-empty U need >= 2 training samples: BatchNorm cannot train on a batch of one), and an accuracy over
an empty test set is NaN, skipped by the means over clients, which say how many clients they cover.
"""

import math

import numpy as np
import pytest
import torch
from torch import nn

from cosmos_pl.algorithms.local import LocalOnly
from cosmos_pl.data import (
    IID,
    ClientData,
    Dirichlet,
    Federation,
    GroupDirichlet,
    ImageData,
    NpzData,
    Partition,
    build_federation,
    dirichlet,
    group_dirichlet,
    iid,
)
from cosmos_pl.errors import ConfigError, DataError, UserError
from test_data import FixedCounts  # the hand-made partitioner of test_data.py
from cosmos_pl.training.client import ClientConfig
from cosmos_pl.federated.runner import Runner, RunSettings
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.training.inference import evaluate
from cosmos_pl.report import mean_sem

CPU = TrainerConfig(accelerator="cpu", channels_last=False)


class AlwaysClassZero(nn.Module):
    """Predicts class 0 for every image, so its accuracy is the share of label 0: known by hand."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(x), self.num_classes)
        logits[:, 0] = 1.0
        return logits


# --------------------------------------------------------------------------- undefined metrics


def test_accuracy_over_an_empty_test_set_is_nan_not_zero():
    empty_x, empty_y = torch.zeros(0, 1, 4, 4, dtype=torch.uint8), torch.zeros(0, dtype=torch.int64)
    assert math.isnan(evaluate(AlwaysClassZero(), empty_x, empty_y, 3, CPU)["top1"])
    scores = evaluate(AlwaysClassZero(25), empty_x, empty_y, 25, CPU)  # top-5 too where M >= 20
    assert set(scores) == {"top1", "top5"} and all(math.isnan(v) for v in scores.values())
    # a non-empty set still scores: labels [0, 0, 1, 2] -> 2 of 4 right
    x, y = torch.zeros(4, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 0, 1, 2])
    assert evaluate(AlwaysClassZero(), x, y, 3, CPU)["top1"] == pytest.approx(0.5)


def test_mean_sem_skips_undefined_values_and_counts_the_rest():
    # defined: 0.5 and 0.7 -> mean 0.6; sample std sqrt(2 * 0.1^2 / 1) = 0.1414; SEM = 0.1414 / sqrt(2) = 0.1
    stats = mean_sem([0.5, math.nan, None, 0.7])
    assert stats["mean"] == pytest.approx(0.6) and stats["sem"] == pytest.approx(0.1) and stats["n"] == 2
    assert mean_sem([0.25])["n"] == 1 and mean_sem([0.25])["sem"] == 0.0
    none = mean_sem([math.nan, None])
    assert none["n"] == 0 and math.isnan(none["mean"]) and math.isnan(none["sem"])


def _client(y_train, y_test) -> ClientData:
    y, yt = torch.tensor(y_train, dtype=torch.int64), torch.tensor(y_test, dtype=torch.int64)
    return ClientData(x=torch.zeros(len(y), 1, 8, 8, dtype=torch.uint8), y=y,
                      x_test=torch.zeros(len(yt), 1, 8, 8, dtype=torch.uint8), y_test=yt,
                      class_counts=np.bincount(y_train, minlength=3))


def test_round_mean_leaves_out_a_client_without_test_samples():
    # client 0: test labels [0, 0, 1, 2] -> 0.5; client 1: no test samples -> undefined; client 2: [0, 0, 0, 1]
    # -> 0.75. Mean over the 2 defined clients 0.625 (the old code crashed or averaged a 0 in: 0.4167);
    # SEM = std([0.5, 0.75], ddof=1) / sqrt(2) = 0.17678 / 1.41421 = 0.125.
    clients = [_client([0, 1], [0, 0, 1, 2]), _client([1, 2], []), _client([0, 0], [0, 0, 0, 1])]
    fed = Federation(public=torch.zeros(4, 1, 8, 8, dtype=torch.uint8), clients=clients,
                     partition=Partition([np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]),
                     partition_labels=np.array([0, 1, 1, 2, 0, 0]), num_classes=3, classes=["a", "b", "c"],
                     in_chans=1, image_shape=(8, 8))
    runner = Runner(fed, LocalOnly(), ClientConfig(backbones=["test_efficientnet"]), RunSettings(rounds=1, trainer=CPU))
    try:
        for c in runner.clients.clients:  # the in-process clients' models
            c.model = AlwaysClassZero()
        row = runner.evaluate(0, "local-only")
    finally:
        runner.executor.close()
    per_client = runner.recorder.client_rows
    assert per_client[0]["client_acc"] == pytest.approx(0.5) and per_client[2]["client_acc"] == pytest.approx(0.75)
    assert math.isnan(per_client[1]["client_acc"])
    assert row["client_acc_mean"] == pytest.approx(0.625) and row["client_acc_sem"] == pytest.approx(0.125)
    assert row["personalized_acc_mean"] == pytest.approx(0.625) and row["personalized_acc_clients"] == 2


# --------------------------------------------------------------------------- untrainable partitions


def small_data(train_counts=(10, 10, 10), test_counts=(5, 5, 5)) -> ImageData:
    ytr = torch.tensor(np.repeat(np.arange(len(train_counts)), train_counts), dtype=torch.int64)
    yte = torch.tensor(np.repeat(np.arange(len(test_counts)), test_counts), dtype=torch.int64)
    return ImageData("small", torch.zeros(len(ytr), 1, 2, 2, dtype=torch.uint8), ytr,
                     torch.zeros(len(yte), 1, 2, 2, dtype=torch.uint8), yte, ["a", "b", "c"])


def test_clients_with_fewer_than_two_training_samples_are_refused_naming_them():
    data = small_data()
    with pytest.raises(DataError) as err:
        build_federation(data, FixedCounts([[5, 5, 5], [0, 0, 0], [1, 0, 0], [2, 0, 0]]), 4, public_fraction=0.0)
    msg = str(err.value)
    assert "2 client(s) with fewer than 2 training samples (client 1: 0, client 2: 1)" in msg
    assert "data.num_clients=4" in msg and "FixedCounts(" in msg
    # two samples are enough: client 3 above had 2 and was not named
    fed = build_federation(data, FixedCounts([[5, 5, 5], [2, 0, 0]]), 2, public_fraction=0.0)
    assert [len(c.y) for c in fed.clients] == [15, 2]


def test_the_refusal_names_the_partitioner_setting_to_raise():
    # 30 samples, IID over 20 clients: ten clients of 2 and ten of 1
    with pytest.raises(DataError, match=r"client 10: 1.*Partitioner IID\(\).*fewer data.num_clients \(now 20\)"):
        build_federation(small_data(), IID(), 20, public_fraction=0.0)
    with pytest.raises(DataError, match=r"raise data.partitioner.init_args.min_samples_per_client to >= 2 \(now 0\)"
                                        r".*alpha \(now 0.01\)"):
        build_federation(small_data((40, 40, 40)), Dirichlet(alpha=0.01, min_samples_per_client=0), 10,
                         public_fraction=0.0, seed=1)


def test_the_validation_split_may_not_leave_a_client_one_training_sample():
    # client 1 holds 2 samples; validation_fraction 0.5 takes round_half_up(1.0) = 1, leaving 1 to train on
    with pytest.raises(DataError, match=r"client 1: 1.*a smaller data.validation_fraction \(now 0.5\)"):
        build_federation(small_data(), FixedCounts([[5, 5, 5], [2, 0, 0]]), 2, public_fraction=0.0,
                         validation_fraction=0.5)


def test_a_class_clients_hold_without_test_samples_is_refused():
    # class c: 10 training samples, 0 test samples; client 0 holds 2 of them (client 1 none): its test set would
    # have lost c's share without a word
    data = small_data(test_counts=(5, 5))
    with pytest.raises(DataError) as err:
        build_federation(data, FixedCounts([[5, 5, 2], [5, 5, 0]]), 2, public_fraction=0.0)
    assert str(err.value) == (
        "data set 'small': 1 class(es) with training samples have no test samples: 'c' (2 training, 0 test). Each "
        "client's test set is drawn in proportion to its own training classes, so a client holding these would be "
        "scored on fewer test samples and never on them: add test samples of these classes to the test split, or "
        "leave their training samples out")
    # counted over what clients hold: a class no client holds needs no test sample
    fed = build_federation(data, FixedCounts([[5, 5, 0], [5, 5, 0]]), 2, public_fraction=0.0)
    assert [torch.bincount(c.y_test, minlength=3).tolist() for c in fed.clients] == [[5, 5, 0], [5, 5, 0]]


def test_a_public_set_of_fewer_than_two_samples_is_refused():
    data = small_data()  # 30 training samples
    # round_half_up(0.04 * 30) = round_half_up(1.2) = 1 sample; 0.01 * 30 = 0.3 -> 0 samples though asked for
    for fraction, size in ((0.04, 1), (0.01, 0)):
        with pytest.raises(ConfigError, match=rf"data.public_fraction={fraction} gives a public set U of {size} of "
                                              r"the 30 training samples.*at least 0.05\b"):
            build_federation(data, IID(), 3, public_fraction=fraction)
    # the minimum named is enough: round_half_up(0.05 * 30) = round_half_up(1.5) = 2; 0 means no U at all
    assert len(build_federation(data, IID(), 3, public_fraction=0.05).public) == 2
    assert len(build_federation(data, IID(), 3, public_fraction=0.0).public) == 0


def test_partitioners_default_to_two_samples_per_client():
    # 24 samples over 5 clients, alpha 0.5: with min_samples_per_client=1 seeds 0, 1, 3, 4 and 5 leave a client
    # of exactly 1 sample (which BatchNorm cannot train); the default 2 redraws them away
    y = np.array([0] * 4 + [1] * 20)
    for seed in (0, 1, 3, 4, 5):
        assert dirichlet(y, 5, alpha=0.5, min_samples_per_client=1, seed=seed).sizes.min() == 1
        assert dirichlet(y, 5, alpha=0.5, seed=seed).sizes.min() >= 2
    assert Dirichlet().min_samples_per_client == 2 and GroupDirichlet().min_samples_per_client == 2


@pytest.mark.parametrize("call, kind, text", [
    (lambda: dirichlet(np.arange(6) % 3, 3, alpha=0.0), ConfigError, "data.partitioner.init_args.alpha=0.0"),
    (lambda: dirichlet(np.arange(6) % 3, 0), ConfigError, "data.num_clients=0"),
    (lambda: iid(np.arange(3), 4), ConfigError, "data.num_clients=4 exceeds the 3 training samples"),
    (lambda: group_dirichlet(np.arange(30) % 3, 4, num_groups=4), ConfigError,
     "data.partitioner.init_args.num_groups=4 exceeds the 3 classes"),
    (lambda: group_dirichlet(np.arange(6) % 3, 3, mix_fraction=1.0, num_groups=3), ConfigError,
     "data.partitioner.init_args.mix_fraction=1.0"),
    (lambda: group_dirichlet(np.array([0] + [1] * 20), 4, num_groups=2, mix_fraction=0.0, min_samples_per_client=1),
     DataError, "data.partitioner.init_args.min_samples_per_client=1 cannot be met"),
    (lambda: dirichlet(np.array([0.5, 1.0]), 1), DataError, "labels must be integers"),
    (lambda: dirichlet(np.array([0, -1]), 1), DataError, "non-negative"),
])
def test_impossible_partitions_are_user_errors_naming_the_setting(call, kind, text):
    with pytest.raises(kind, match=text) as err:
        call()
    assert isinstance(err.value, UserError)  # one line from the CLI, exit 2, not an internal fault


def test_cli_refuses_a_partition_with_an_empty_client_before_training(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    run_dir = tmp_path / "run"
    rc = main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--wandb.mode", "disabled",
               "--run_dir", str(run_dir), "--rounds", "1", "--clients.pretrain_epochs", "1",
               "--data.partitioner", "cosmos_pl.data.Dirichlet", "--data.partitioner.init_args.alpha", "0.01",
               "--data.partitioner.init_args.min_samples_per_client", "0", "--seed", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "client 4: 0" in err and "min_samples_per_client" in err
    assert not (run_dir / "metrics.csv").exists()  # refused before round 0


# --------------------------------------------------------------------------- data sets checked on load


def _archive(**changes) -> dict:
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.integers(0, 256, (6, 5, 5, 3), dtype=np.uint8), y_train=np.array([0, 1, 2, 0, 1, 2]),
                  x_test=rng.integers(0, 256, (3, 5, 5, 3), dtype=np.uint8), y_test=np.array([0, 1, 2]),
                  classes=np.array(["a", "b", "c"]))
    arrays.update(changes)
    return {k: v for k, v in arrays.items() if v is not None}


BAD_ARCHIVES = {
    "channels differ": (dict(x_test=np.zeros((3, 5, 5, 1), np.uint8)), "x_test", "C x H x W = 1 x 5 x 5 but x_train has 3 x 5 x 5"),
    "sizes differ": (dict(x_test=np.zeros((3, 4, 5, 3), np.uint8)), "x_test", "3 x 5 x 5"),
    "label beyond classes": (dict(y_train=np.array([0, 1, 2, 0, 1, 3])), "y_train", "label 3, outside 0..2"),
    "negative label": (dict(y_test=np.array([0, -1, 2])), "y_test", "label -1"),
    "float labels": (dict(y_train=np.array([0, 1, 2, 0, 1, 1.5])), "y_train", "dtype float64"),
    "float images": (dict(x_train=np.full((6, 5, 5, 3), 0.5, np.float32)), "x_train",
                     "dtype float32; images must be uint8 0..255: its values lie in [0.5, 0.5], so convert with "
                     "(x * 255).round().astype(np.uint8)"),
    "float images in 0..255": (dict(x_train=np.full((6, 5, 5, 3), 200.0)), "x_train",
                               "its values already lie in [200, 200], so convert with x.round().astype(np.uint8)"),
    "normalized images": (dict(x_train=np.full((6, 5, 5, 3), -1.5)), "x_train",
                          "outside both [0, 1] and [0, 255] (normalized images?)"),
    "string labels": (dict(y_train=np.array(list("abcabc")), classes=None), "y_train",
                      "field y_train has dtype <U1; labels must be integer class indices into classes"),
    "object labels": (dict(y_test=np.array([0, "b", 2], dtype=object)), "y_test", "cannot be read without pickle"),
    "images above 255": (dict(x_test=np.full((3, 5, 5, 3), 300, np.int64)), "x_test", "0..300"),
    "empty test split": (dict(x_test=np.zeros((0, 5, 5, 3), np.uint8), y_test=np.zeros(0, np.int64)), "x_test",
                         "test split is empty"),
    "x and y lengths": (dict(y_train=np.array([0, 1, 2, 0, 1])), "y_train", "6 images but y_train holds 5"),
    "labels 2-D": (dict(y_train=np.zeros((6, 1), np.int64)), "y_train", "must be 1-D"),
    "channels first": (dict(x_train=np.zeros((6, 3, 32, 32), np.uint8), x_test=np.zeros((3, 3, 32, 32), np.uint8)),
                       "x_train", "channels-first"),
    "missing array": (dict(y_test=None), "y_test", "lacks arrays"),
}


@pytest.mark.parametrize("case", BAD_ARCHIVES)
def test_a_broken_npz_fails_on_load_naming_file_and_field(tmp_path, case):
    changes, field, text = BAD_ARCHIVES[case]
    path = tmp_path / "broken.npz"
    np.savez(path, **_archive(**changes))
    with pytest.raises(DataError) as err:
        NpzData(str(path)).load()
    msg = str(err.value)
    assert str(path) in msg and "'broken'" in msg and field in msg and text in msg, msg


def test_a_good_npz_still_loads(tmp_path):
    path = tmp_path / "good.npz"
    np.savez(path, **_archive(y_train=np.array([0, 1, 2, 0, 1, 2], dtype=np.int32)))
    data = NpzData(str(path)).load()
    assert data.x_train.shape == (6, 3, 5, 5) and data.y_train.dtype == torch.int64 and data.source == str(path)


def test_image_data_checks_every_loader_output():
    ok = small_data()
    with pytest.raises(DataError, match="field y_test holds label 3, outside 0..2"):
        ImageData("hand", ok.x_train, ok.y_train, ok.x_test, torch.tensor([0, 1, 3] * 5), ok.classes)
    with pytest.raises(DataError, match="field classes is empty"):
        ImageData("hand", ok.x_train, torch.zeros(30, dtype=torch.int64), ok.x_test, ok.y_test, [])
    with pytest.raises(DataError, match=r"field x_train must be a uint8 tensor \[N, C, H, W\]"):
        ImageData("hand", ok.x_train.float(), ok.y_train, ok.x_test, ok.y_test, ok.classes)


# --------------------------------------------------------------------------- data errors through the CLI: one line


def _fit_on(repo_root, tmp_path, *dataset):
    return ["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--run_dir", str(tmp_path / "run"),
            "--wandb.mode", "disabled", *dataset]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _image_folder(root, files):
    from torchvision.io import write_png

    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        write_png(torch.zeros((3, 4, 4), dtype=torch.uint8), str(root / rel))


def test_an_undecodable_image_file_is_named(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    root = tmp_path / "images"
    _image_folder(root, ["train/a/0.png", "train/b/1.png", "test/a/2.png", "test/b/3.png"])
    (root / "train" / "b" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    flags = ["--data.dataset", "cosmos_pl.data.ImageFolderData", "--data.dataset.root", str(root)]
    assert main(_fit_on(repo_root, tmp_path, *flags)) == 2
    err = _one_line(capsys)
    assert err.startswith(f"cosmos-pl: error: image file {root}/train/b/1.png cannot be decoded (")
    assert err.endswith("): replace it with a readable image (JPEG, PNG, WebP, BMP, TIFF, PPM or PGM, 8 or 16 bits "
                        "per sample), or remove it")
    assert ".cpp" not in err


def test_three_undecodable_image_files_are_named_in_one_run(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    root = tmp_path / "images"
    _image_folder(root, ["train/a/0.png", "train/a/1.png", "train/b/2.png", "train/b/3.png", "test/a/4.png",
                         "test/b/5.png"])
    broken = [root / "train/a/1.png", root / "train/b/3.png", root / "test/b/5.png"]
    for path in broken:
        path.write_bytes(b"torn")
    flags = ["--data.dataset", "cosmos_pl.data.ImageFolderData", "--data.dataset.root", str(root)]
    assert main(_fit_on(repo_root, tmp_path, *flags)) == 2
    err = _one_line(capsys)
    assert err.startswith(f"cosmos-pl: error: 3 of the 6 image files cannot be decoded: {broken[0]} (")
    assert f"); {broken[1]} (" in err and f"); {broken[2]} (" in err and ".cpp" not in err


def test_an_empty_class_folder_is_named(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    root = tmp_path / "images"
    _image_folder(root, ["train/a/0.png", "test/a/2.png"])
    (root / "train" / "b").mkdir()
    flags = ["--data.dataset", "cosmos_pl.data.ImageFolderData", "--data.dataset.root", str(root)]
    assert main(_fit_on(repo_root, tmp_path, *flags)) == 2
    assert _one_line(capsys).startswith(f"cosmos-pl: error: {root}/train: class folder(s) b hold no image file (.jpg, ")


def test_labels_of_a_non_integer_type_are_one_line(repo_root, tmp_path, capsys):
    from cosmos_pl.cli import main

    path = tmp_path / "names.npz"
    np.savez(path, **_archive(y_train=np.array(list("abcabc")), classes=None))
    assert main(_fit_on(repo_root, tmp_path, "--data.dataset", "cosmos_pl.data.NpzData",
                        "--data.dataset.path", str(path))) == 2
    assert _one_line(capsys) == (f"cosmos-pl: error: data set 'names' ({path}): field y_train has dtype <U1; labels "
                                 "must be integer class indices into classes: map the names to indices and save them "
                                 "with .astype(np.int64)")
