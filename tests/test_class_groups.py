"""A class chosen in a config file or on the command line starts from its own defaults (every class-path group:
algorithm, data set, partitioner, optimizers), and a setting the chosen class does not take is an error naming it.

The expected values are the classes' own signature defaults: COMET ``lambda_=1.0`` (COSMOS's is 5.0), Dirichlet
``alpha=0.5`` (the config's GroupDirichlet has 5.0), SGD ``lr=0.001`` and ``momentum=0.0`` (the config's Adam has
``betas``), NpzData's ``path``.
"""

import pytest
import yaml

from cosmos_pl.cli import main
from cosmos_pl.compare.pairs import pair_configs
from cosmos_pl.parsers import build_compare_parser, build_fit_parser
from cosmos_pl.class_groups import class_args, group_keys, parse_args


@pytest.fixture(scope="module")
def parser():
    return build_fit_parser()


@pytest.fixture
def printed(repo_root, capsys):
    """``cosmos-pl fit --config digits_smoke.yaml FLAGS --print_config`` as a dict."""

    def call(*flags):
        with pytest.raises(SystemExit) as stop:
            main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), *flags, "--print_config"])
        assert stop.value.code in (0, None)
        return yaml.safe_load(capsys.readouterr().out)

    return call


def test_every_class_path_group_is_known(parser):
    assert sorted(group_keys(parser)) == ["algorithm", "clients.distill_optimizer", "clients.optimizer",
                                          "data.dataset", "data.partitioner"]


def test_algorithm_switched_on_the_command_line_has_its_own_defaults(printed):
    algorithm = printed("--algorithm", "COMET")["algorithm"]
    assert algorithm == {"class_path": "cosmos_pl.algorithms.COMET",
                         "init_args": {"num_clusters": 5, "lambda_": 1.0, "epochs": None, "n_init": 10,
                                       "mode": "joint", "warm_start": False}}
    # a short name works too, and a setting typed before or after the switch holds for the new class
    assert printed("--algorithm", "comet", "--algorithm.lambda_", "3")["algorithm"]["init_args"]["lambda_"] == 3.0
    assert printed("--algorithm.lambda_", "2", "--algorithm", "COMET")["algorithm"]["init_args"]["lambda_"] == 2.0


def test_partitioner_dataset_and_optimizers_switched_on_the_command_line_have_their_own_defaults(printed):
    cfg = printed("--data.partitioner", "cosmos_pl.data.Dirichlet", "--clients.optimizer", "torch.optim.SGD",
                  "--data.dataset", "cosmos_pl.data.NpzData",
                  "--algorithm.teacher_optimizer", "torch.optim.SGD")
    assert cfg["data"]["partitioner"] == {"class_path": "cosmos_pl.data.Dirichlet",
                                          "init_args": {"alpha": 0.5, "min_samples_per_client": 2}}
    assert cfg["data"]["dataset"] == {"class_path": "cosmos_pl.data.NpzData",
                                      "init_args": {"path": "../shared/data/cifar10_subset.npz"}}
    for optimizer in (cfg["clients"]["optimizer"], cfg["algorithm"]["init_args"]["teacher_optimizer"]):
        assert optimizer["class_path"] == "torch.optim.SGD"
        assert optimizer["init_args"]["lr"] == 0.001 and optimizer["init_args"]["momentum"] == 0.0
        assert "betas" not in optimizer["init_args"]
    # what was not switched keeps the config's settings
    assert cfg["clients"]["distill_optimizer"]["init_args"]["lr"] == 0.0001
    assert cfg["algorithm"]["init_args"]["lambda_"] == 5.0 and cfg["algorithm"]["init_args"]["ptc_epochs"] == 10


def test_a_config_file_naming_another_class_has_that_classes_defaults(parser, tmp_path):
    path = tmp_path / "comet.yaml"
    path.write_text("algorithm:\n  class_path: cosmos_pl.algorithms.COMET\n  init_args: {num_clusters: 3}\n"
                    "data:\n  partitioner: {class_path: cosmos_pl.data.Dirichlet}\n")
    cfg = parse_args(parser, ["--config", str(path)])
    assert cfg.algorithm.init_args.lambda_ == 1.0 and cfg.algorithm.init_args.num_clusters == 3
    assert cfg.data.partitioner.init_args.alpha == 0.5


def test_a_setting_the_new_class_does_not_take_is_an_error_naming_it(repo_root, capsys):
    status = main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithm.ptc_epochs", "2",
                   "--algorithm", "FedMD"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert err.startswith("cosmos-pl: error: algorithm.init_args.ptc_epochs=2: FedMD takes no setting 'ptc_epochs'")
    assert "its settings are digest_epochs, revisit_epochs" in err


def test_an_unknown_algorithm_name_suggests_the_closest(repo_root, capsys):
    assert main(["fit", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithm", "fedmdd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("cosmos-pl: error: algorithm='fedmdd': unknown algorithm; did you mean 'fedmd'? valid names are "
                   "cosmos (COSMOS), local (LocalOnly), fedmd (FedMD), fedct (FedCT), comet (COMET), fedavg (FedAvg), "
                   "ditto (Ditto), fedbabu (FedBABU), fedselect (FedSelect), pfedck (PFedCK), pfedhn (PFedHN)")


def test_argv_without_a_class_choice_is_left_as_it_is(parser):
    argv = ["--seed", "3", "--algorithm.lambda_", "2"]
    assert class_args(parser, argv) == argv


def test_compare_pairs_start_each_algorithm_from_its_own_defaults(repo_root, tmp_path):
    compare = build_compare_parser()
    cfg = compare.parse_args(class_args(compare, ["--config", str(repo_root / "configs/digits_smoke.yaml"),
                                                  "--out", str(tmp_path)]))
    cfg.comparison.settings = {"comet": {"num_clusters": 3}}
    pairs = pair_configs(cfg, compare, build_fit_parser(), tmp_path, ["cosmos", "comet", "fedmd"], [0], 1)
    algorithm = {p.algorithm: yaml.safe_load(p.config_yaml)["algorithm"]["init_args"] for p in pairs}
    assert algorithm["comet"] == {"num_clusters": 3, "lambda_": 1.0, "epochs": None, "n_init": 10, "mode": "joint",
                                  "warm_start": False}
    assert algorithm["cosmos"]["lambda_"] == 5.0 and algorithm["cosmos"]["ptc_epochs"] == 10  # the config's COSMOS
    assert algorithm["fedmd"] == {"digest_epochs": None, "revisit_epochs": None}


def test_compare_settings_for_an_unknown_algorithm_or_setting_are_errors(repo_root, tmp_path, capsys):
    base = ["compare", "--config", str(repo_root / "configs/digits_smoke.yaml"), "--algorithms", "comet",
            "--seeds", "0", "--out", str(tmp_path / "out")]
    assert main([*base, "--comparison.settings", "{fedmdd: {}}"]) == 2
    assert "comparison.settings='fedmdd': unknown algorithm; did you mean 'fedmd'?" in capsys.readouterr().err
    assert main([*base, "--comparison.settings", "{comet: {lamda: 2}}"]) == 2
    err = capsys.readouterr().err
    assert "comparison.settings.comet: algorithm.init_args.lamda=2: COMET takes no setting 'lamda'" in err
    assert "did you mean 'lambda_'?" in err
    assert not (tmp_path / "out").exists()  # refused before anything ran
