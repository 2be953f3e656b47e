"""Griffe extension: the Sphinx roles of the docstrings (``:class:`~cosmos_pl.errors.ConfigError```) as links.

mkdocstrings reads the docstrings as markdown, where a role would print as it is written. Once the package is
loaded, each role of a docstring (found by :func:`cosmos_pl.docstrings.replace_roles`, the same function that makes
``--help`` plain text) becomes an optional cross-reference, ``<autoref identifier="PATH" optional>`TITLE`</autoref>``:
mkdocs-autorefs makes it a link to PATH where the site renders PATH, and leaves the title as plain code where it
does not (a target outside the API reference, ``torch.nn.Module``). An optional reference that does not resolve is
no warning, so ``mkdocs build --strict`` passes whichever objects the API pages render.

A target relative to the docstring (``COSMOS``, ``Algorithm.plan``, ``inference_batch``) is resolved in the
docstring's scope as Sphinx does: the object's members, its parents', and the names its module imports.

Loaded by mkdocstrings' python handler (``extensions:`` in mkdocs.yml); it is not part of the package.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any, Iterator

import griffe

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # cosmos_pl, from the repository that holds mkdocs.yml
    sys.path.insert(0, _ROOT)

from cosmos_pl.docstrings import Role, replace_roles  # noqa: E402

_UNRESOLVABLE = (griffe.NameResolutionError, griffe.AliasResolutionError, griffe.CyclicAliasError)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of a loaded package, before any is parsed into sections."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Replace the roles of every docstring in ``pkg`` (modules, classes, functions, attributes)."""
        for obj in _objects(pkg):
            docstring = obj.docstring
            if docstring is None or ":" not in docstring.value:
                continue
            docstring.value = replace_roles(docstring.value, lambda role, obj=obj: autoref(role, obj, loader))
            docstring.__dict__.pop("parsed", None)  # parsed before (by another extension): parse the new text


def autoref(role: Role, obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
    """The markdown of one role: an optional cross-reference to its target's full path, titled in code."""
    target = resolve(role.target, obj, loader)
    return f'<autoref identifier="{html.escape(target)}" optional>`{role.title}`</autoref>'


def resolve(target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
    """``target``'s full dotted path: as written where it starts with a loaded package (``cosmos_pl.x``), else
    its first name resolved in ``obj``'s scope; as written where that fails (the reference then stays code)."""
    head, _, rest = target.partition(".")
    if head in loader.modules_collection.members:
        return target
    try:
        path = obj.resolve(head)
    except _UNRESOLVABLE:
        return target
    return f"{path}.{rest}" if rest else path


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined under it (not what it imports: that is documented where it is defined)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)
