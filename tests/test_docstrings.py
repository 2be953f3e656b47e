"""The docstrings' Sphinx roles in ``--help`` (cosmos_pl/docstrings.py): found and read as Sphinx reads them, and
printed as plain text by every parser of ``cosmos-pl``, the parsers jsonargparse makes for ``--X.help CLASS`` too."""

import re

import pytest

from cosmos_pl.cli import main
from cosmos_pl.docstrings import ROLE, ArgumentParser, Role, plain_roles, plain_text, replace_roles
from cosmos_pl.parsers import build_fit_parser

# a role as a terminal or a page would print it unread: ":class:`..." (or ":class:" before a code span)
PRINTED_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|obj|exc|const|type|ref):")


@pytest.mark.parametrize("text, plain", [
    (":class:`~cosmos_pl.errors.ConfigError`", "ConfigError"),
    (":func:`cosmos_pl.fit.run_fit`", "cosmos_pl.fit.run_fit"),
    ("see :meth:`the fit <cosmos_pl.Algorithm.fit>`.", "see the fit."),
    (":py:attr:`!a.b`, :data:`~.c.D` and :mod:`m`", "a.b, D and m"),
    (":func:`cosmos_pl.fit.\n    run_fit`", "cosmos_pl.fit.run_fit"),  # a role wrapped over two docstring lines
    ("``:class:`C``` shows the syntax", "``:class:`C``` shows the syntax"),  # inside an inline literal: kept
    ("no role: a:b `c` ``d``", "no role: a:b `c` ``d``"),
])
def test_plain_roles_write_what_sphinx_shows(text, plain):
    assert plain_roles(text) == plain


def test_plain_text_drops_the_literals_backticks_and_writes_roles_by_title():
    text = ("epochs per round; null uses ``clients.local_epochs`` (:class:`~cosmos_pl.config.ClientConfig`); "
            "``:class:`x``` is how a role is written")
    assert plain_text(text) == ("epochs per round; null uses clients.local_epochs (ClientConfig); "
                                ":class:`x` is how a role is written")


def test_replace_roles_hands_each_role_to_the_writer():
    seen = []
    out = replace_roles("x :class:`~a.B` y :meth:`.C.run` z", lambda role: seen.append(role) or "<>")
    assert out == "x <> y <> z"
    assert seen == [Role("class", "a.B", "B"), Role("meth", "C.run", "C.run")]


class Source:
    """A thing to read from.

    Args:
        size: how many rows, at most :data:`~cosmos_pl.report.NO_TERMINAL_WIDTH` (see :func:`cosmos_pl.fit.run_fit`).
    """

    def __init__(self, size: int = 3) -> None:
        self.size = size


class Wide(Source):
    """A wider :class:`Source`.

    Args:
        width: columns, as :meth:`~cosmos_pl.Algorithm.plan` plans them.
    """

    def __init__(self, size: int = 3, width: int = 4) -> None:
        super().__init__(size)
        self.width = width


def _help(parser, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_help_prints_roles_as_plain_text(capsys):
    parser = ArgumentParser(prog="x")
    parser.add_class_arguments(Source, "source")
    parser.add_subclass_arguments(Source, "thing")
    text = " ".join(_help(parser, ["--help"], capsys).split())
    assert "how many rows, at most NO_TERMINAL_WIDTH (see cosmos_pl.fit.run_fit)" in text
    assert not PRINTED_ROLE.search(text), text
    # --thing.help CLASS: a parser jsonargparse makes of the same class, so the same formatter
    text = " ".join(_help(parser, ["--thing.help", f"{Wide.__module__}.Wide"], capsys).split())
    assert "columns, as plan plans them" in text
    assert not PRINTED_ROLE.search(text), text


def test_fit_parser_help_texts_hold_roles():
    """The help texts jsonargparse reads from the docstrings hold roles: the tests of --help below can fail."""
    parser = build_fit_parser()
    texts = [action.help or "" for action in parser._actions]
    texts += [group.description or "" for group in parser._action_groups]
    assert any(ROLE.search(text) for text in texts)


@pytest.mark.parametrize("argv", [
    ["fit", "--help"],
    ["compare", "--help"],
    ["export-partition", "--help"],
    ["fit", "--algorithm.help", "cosmos_pl.algorithms.COSMOS"],
    ["fit", "--algorithm.help", "cosmos_pl.algorithms.FedMD"],
    ["fit", "--data.dataset.help", "cosmos_pl.data.FashionMNIST"],
])
def test_cli_help_has_no_literal_role(argv, capsys):
    try:  # jsonargparse's help exits; cosmos-pl's own --algorithm.help returns
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    assert status in (0, None)
    out = capsys.readouterr().out
    assert "usage:" in out or "Help for" in out or "--algorithm" in out, out[:500]
    printed = [out[max(0, m.start() - 60): m.end() + 40] for m in PRINTED_ROLE.finditer(out)]
    assert not printed, f"cosmos-pl {' '.join(argv)} prints roles as written: {printed}"
    assert "``" not in out, f"cosmos-pl {' '.join(argv)} prints an inline literal's backticks"
