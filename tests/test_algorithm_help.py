"""``cosmos-pl fit --algorithm.help NAME``: by the names ``--algorithm`` takes, with a description for every one."""

import pytest

from cosmos_pl.algorithms import ALGORITHMS
from cosmos_pl.cli import main


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps the help to the terminal's width (and breaks at hyphens)


def _help(capsys, *argv):
    status = main(["fit", *argv])
    out = capsys.readouterr()
    assert status == 0 and out.err == ""
    return out.out


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_short_name_gives_that_algorithms_options(capsys):
    text = _help(capsys, "--algorithm.help", "fedmd")
    assert "--algorithm.digest_epochs DIGEST_EPOCHS" in text and "--algorithm.revisit_epochs" in text
    assert "--algorithm.ptc_epochs" not in text  # COSMOS's, the default algorithm's
    assert _flat(text).startswith("usage: cosmos-pl fit [--algorithm.digest_epochs DIGEST_EPOCHS] "
                                  "[--algorithm.revisit_epochs REVISIT_EPOCHS] FedMD (--algorithm fedmd): federated "
                                  "model distillation through a consensus on a public set. Scored model: the client "
                                  "model f_i.")
    # the class name (any case), the class path and the --X=V form give the same text
    for name in ("FedMD", "fedMD", "cosmos_pl.algorithms.FedMD"):
        assert _help(capsys, "--algorithm.help", name) == text
    assert _help(capsys, "--algorithm.help=fedmd") == text


def test_an_unknown_name_is_one_line_with_the_closest(capsys):
    assert main(["fit", "--algorithm.help", "fedmdd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cosmos-pl: error: --algorithm.help='fedmdd': unknown algorithm; did you mean 'fedmd'? "
                          "valid names are cosmos (COSMOS), local (LocalOnly)") and "\n" not in err


def test_algorithms_without_settings_of_their_own_are_described(capsys):
    assert _flat(_help(capsys, "--algorithm.help", "local")) == (
        "usage: cosmos-pl fit LocalOnly (--algorithm local): Local-only training: the floor every federated method "
        "must beat. Scored model: the client model f_i. Clients train clients.local_epochs epochs of "
        "cross-entropy on D_i per round; no uploads, no server. LocalOnly has no settings of its own: its clients "
        "train with the clients group's (clients.local_epochs, ...).")
    assert _flat(_help(capsys, "--algorithm.help", "fedavg")) == (
        "usage: cosmos-pl fit FedAvg (--algorithm fedavg): sample-weighted averaging of model parameters "
        "(homogeneous clients only). Scored model: the client model f_i (after loading the average, the global "
        "model). Local training, upload weights, sample-weighted average, every client loads it. FedAvg has no "
        "settings of its own: its clients train with the clients group's (clients.local_epochs, ...).")


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_has_a_description(capsys, name):
    cls = ALGORITHMS[name]
    text = _flat(_help(capsys, "--algorithm.help", name))
    head = f"{cls.__name__} (--algorithm {name}): "
    assert head in text
    description = text.split(head, 1)[1]
    assert len(description.split(". Scored model: ", 1)[0]) >= 30  # the module's summary, a sentence
    assert ("has no settings of its own" in description) != ("--algorithm." in text)  # its settings, or why none


def test_without_a_name_every_algorithm_is_listed(capsys):
    lines = _help(capsys, "--algorithm.help").splitlines()
    assert lines[:3] == ["usage: cosmos-pl fit --algorithm.help NAME", "",
                         "The algorithms (NAME, its class, what it does):"]
    assert [line.split()[:2] for line in lines[3:]] == [[name, f"{cls.__name__}:"] for name, cls in ALGORITHMS.items()]
    assert lines[4] == "  local      LocalOnly: Local-only training: the floor every federated method must beat."
