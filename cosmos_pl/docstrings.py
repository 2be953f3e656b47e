"""The Sphinx cross-reference roles of the docstrings (``:class:`~cosmos_pl.errors.ConfigError```), for readers.

The docstrings name other objects with Sphinx roles, which neither ``--help`` (jsonargparse takes its help text
from the docstrings) nor the API reference (mkdocstrings reads the docstrings as markdown) understands: printed as
they are, they read ``:class:`~cosmos_pl.errors.ConfigError```. :func:`replace_roles` finds every role and hands it
to a function that writes it out; :func:`plain_roles` writes the text Sphinx would show (``ConfigError``), and
:class:`HelpFormatter`, the formatter of every ``cosmos-pl`` parser (:class:`ArgumentParser`), applies it to the
help text. The docs build's griffe extension (``docs/hooks/griffe_roles.py``) writes each role as a link where the
site documents the target and as code where it does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import jsonargparse

__all__ = ["ROLE", "Role", "replace_roles", "plain_roles", "plain_text", "HelpFormatter", "ArgumentParser"]

# a role of Sphinx's Python domain, ``py:`` optional: :class:`a.b.C`, :func:`~a.b.f`, :meth:`title <a.B.m>`
ROLE = re.compile(r":(?:py:)?(?P<kind>class|func|meth|mod|attr|data|obj|exc|const|type):`(?P<body>[^`]+)`")
_TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
# an inline literal (``...``), which may show a role's syntax: left as it is
_LITERAL_OR_ROLE = re.compile(r"(?P<literal>``.+?``(?!`))|" + ROLE.pattern, re.DOTALL)


@dataclass(frozen=True)
class Role:
    """One role as Sphinx reads it.

    Attributes:
        kind: The role's name (``class``, ``func``, ``meth``, ``mod``, ``attr``, ...).
        target: The dotted name it refers to, as written (``cosmos_pl.errors.ConfigError``, or one relative to
            the docstring's scope such as ``Algorithm.plan``), without ``~``, ``!`` or a leading ``.``.
        title: The text Sphinx shows: the explicit title of ``title <target>``, the last component for
            ``~a.b.C`` (``C``), else the target as written.
    """

    kind: str
    target: str
    title: str

    @classmethod
    def parse(cls, kind: str, body: str) -> Role:
        """The role ``:KIND:`BODY```; whitespace inside the body (a role wrapped over two lines) is dropped."""
        body = " ".join(body.split())
        titled = _TITLED.match(body)
        if titled and titled["title"]:
            return cls(kind, titled["target"].strip().lstrip("~!.").replace(" ", ""), titled["title"])
        shown = body.replace(" ", "").lstrip("!")
        target = shown.lstrip("~").lstrip(".")
        return cls(kind, target, target.rsplit(".", 1)[-1] if shown.startswith("~") else target)


def replace_roles(text: str, write: Callable[[Role], str]) -> str:
    """``text`` with every role replaced by ``write(role)``; a role inside an inline literal (between double
    backticks) and text without a role stay as they are."""

    def one(match: re.Match) -> str:
        return match["literal"] or write(Role.parse(match["kind"], match["body"]))

    return _LITERAL_OR_ROLE.sub(one, text)


def plain_roles(text: str) -> str:
    """``text`` with every role replaced by its title, as a terminal shows it: ``:class:`~a.b.C``` -> ``C``,
    ``:func:`a.b.f``` -> ``a.b.f``, ``:meth:`the fit <a.B.fit>``` -> ``the fit``."""
    return replace_roles(text, lambda role: role.title)


def plain_text(text: str) -> str:
    """``text`` as a terminal shows it: every role by its title (:func:`plain_roles`) and every inline literal
    without its double backticks (````clients.local_epochs```` -> ``clients.local_epochs``)."""

    def one(match: re.Match) -> str:
        literal = match["literal"]
        return literal[2:-2] if literal else Role.parse(match["kind"], match["body"]).title

    return _LITERAL_OR_ROLE.sub(one, text)


class HelpFormatter(jsonargparse.DefaultHelpFormatter):
    """jsonargparse's help formatter, with the docstrings' markup in the help text written as plain text
    (:func:`plain_text`: roles by their titles, inline literals without backticks) before the text is wrapped."""

    def _split_lines(self, text: str, width: int) -> list[str]:  # an option's help
        return super()._split_lines(plain_text(text), width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:  # a description: the parser's, a group's
        return super()._fill_text(plain_text(text), width, indent)

    def start_section(self, heading: str | None) -> None:  # a group's title: a class's first docstring line
        super().start_section(plain_text(heading) if heading else heading)


class ArgumentParser(jsonargparse.ArgumentParser):
    """jsonargparse's parser with :class:`HelpFormatter` as its default formatter; the parsers jsonargparse makes
    from one (``--algorithm.help CLASS`` builds its own) are of the same class, so they print plain text too."""

    def __init__(self, *args, formatter_class: type = HelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
