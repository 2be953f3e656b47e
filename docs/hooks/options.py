"""MkDocs hook: the option reference, generated from the jsonargparse parsers at build time.

A page line ``<!-- options: fit -->`` (or ``compare``) is replaced by tables of every option that parser takes,
read from :func:`cosmos_pl.parsers.build_fit_parser` / :func:`cosmos_pl.parsers.build_compare_parser`: the flag,
its type, its default and its help, grouped by top-level section (``data``, ``clients``, ``trainer``, ...).
``compare`` lists only what it adds to ``fit`` (it takes every ``fit`` option too). Nothing here names an option:
an option added to a parser appears on the next build.

Class-path options (``algorithm``, ``data.dataset``, ``data.partitioner``, ``clients.optimizer``, ...) are one row
each: the base class, the default class and its ``init_args``; the chosen class's own settings are listed by
``cosmos-pl fit --<option>.help CLASS`` and in the API reference.

Loaded by mkdocs (``hooks:`` in mkdocs.yml; mkdocs >= 1.4); it is not part of the package.
"""

from __future__ import annotations

import argparse
import collections.abc
import html
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!--\s*options:\s*(\w+)\s*-->[ \t]*$", re.MULTILINE)

# the top-level options that belong to no settings group are listed first, under this title
GENERAL = "general"
# argparse/jsonargparse actions that are not settings: --help, a group's "--data CONFIG" loader
_SKIPPED_ACTIONS = ("_HelpAction", "_ActionConfigLoad")


def on_startup(command: str, dirty: bool) -> None:
    """Make the repository importable (mkdocs.yml's folder), whatever the working folder."""
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- options: NAME -->`` line of a page by NAME's option tables."""
    if not MARKER.search(markdown):
        return markdown
    api_pages = {f.src_uri for f in files if f.src_uri.startswith("api/")}
    depth = page.file.src_uri.count("/")  # links to api/ from the page's own folder

    return MARKER.sub(lambda match: option_tables(match.group(1), api_pages, "../" * depth), markdown)


# ---------------------------------------------------------------- the parsers' options


def _parsers() -> dict[str, Any]:
    from cosmos_pl.parsers import build_compare_parser, build_fit_parser

    return {"fit": build_fit_parser, "compare": build_compare_parser}


def option_tables(name: str, api_pages: set[str], prefix: str = "") -> str:
    """The markdown of one parser's options: a table per top-level section, each under a ``###`` heading."""
    builders = _parsers()
    if name not in builders:
        raise ValueError(f"<!-- options: {name} -->: no such parser; known: {', '.join(builders)}")
    parser = builders[name]()
    known: set[str] = set()
    if name != "fit":  # the other subcommands take every fit option: list only their own
        known = {action.dest for action in builders["fit"]()._actions}
    loaders = {a.dest for a in parser._actions if type(a).__name__ == "_ActionConfigLoad"}
    actions = [a for a in parser._actions if type(a).__name__ not in _SKIPPED_ACTIONS and a.dest not in known]
    help_actions = {a.dest[: -len(".help")]: a for a in actions if _is_class_help(a)}
    actions = [a for a in actions if not _is_class_help(a)]

    sections: dict[str, list[argparse.Action]] = {}
    for action in actions:
        section = action.dest.split(".", 1)[0] if "." in action.dest or action.dest in parser.groups else GENERAL
        sections.setdefault(section, []).append(action)
    if GENERAL in sections:  # first, as --help lists them
        sections = {GENERAL: sections.pop(GENERAL), **sections}

    out: list[str] = []
    for section, rows in sections.items():
        group = parser.groups.get(section) if section != GENERAL else None
        title = f"`{section}`" if section != GENERAL else ("General" if name == "fit" else f"{name}'s own")
        out += [f"### {title}", ""]
        if group is not None and group.description:
            out += [_inline(group.description.strip().rstrip(".")) + ".", ""]
        if section in loaders:
            out += [f"The whole section can also come from a file of its own: `--{section} FILE.yaml`.", ""]
        # in a block of class option-table (md_in_html): docs/css/options.css keeps each flag on one line
        out += ['<div class="option-table" markdown>', ""]
        out += ["| option | type | default | what it does |", "| --- | --- | --- | --- |"]
        for action in rows:
            out.append(_row(action, help_actions.get(action.dest), api_pages, prefix))
        out += ["", "</div>", ""]
    return "\n".join(out)


def _is_class_help(action: argparse.Action) -> bool:
    """``--X.help CLASS``: jsonargparse's help for the class chosen in class-path option X."""
    return action.dest.endswith(".help") and hasattr(action, "_help_types")


def _row(action: argparse.Action, class_help: argparse.Action | None, api_pages: set[str], prefix: str) -> str:
    flags = "<br>".join(f"`{flag}`" for flag in action.option_strings)  # one flag a line
    help_text = _inline(action.help or "")
    if class_help is not None:
        bases = getattr(class_help, "_help_types", ()) or ()
        kind = " or ".join(_code(_qualname(b)) for b in bases) or "a class"
        type_text = f"class path: a subclass of {kind}"
        flag = class_help.option_strings[0]
        links = [f"[API reference]({prefix}{page})" for page in sorted({_api_page(b, api_pages) for b in bases})
                 if page]
        help_text += (f" The chosen class's own settings ({_code(action.option_strings[0] + '.init_args.NAME')}, or "
                      f"{_code(action.option_strings[0] + '.NAME')}): {_code(f'cosmos-pl fit {flag} CLASS')}"
                      + (f"; {', '.join(links)}" if links else "") + ".")
        default = _class_default(action.default)
    else:
        type_text = _type_text(action)
        default = _default(action)
    return f"| {flags} | {type_text} | {default} | {help_text} |"


def _type_text(action: argparse.Action) -> str:
    typehint = getattr(action, "_typehint", None)
    if typehint is None:
        typehint = action.type
    if type(action).__name__ == "ActionConfigFile":
        return "path to a YAML file"
    if type(action).__name__ == "_ActionPrintConfig":
        return "flag"
    if typehint is None:
        return "-"
    text = _code(format_type(typehint))
    if isinstance(action, argparse._AppendAction):
        text += ", repeatable"
    return text


def format_type(typehint: Any) -> str:
    """A type hint as a reader writes it: ``int | None``, ``'top1' | 'top5'``, ``list[str]``."""
    if typehint is type(None):
        return "None"
    origin = typing.get_origin(typehint)
    args = typing.get_args(typehint)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return " | ".join(format_type(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is collections.abc.Callable:
        params, result = args[0], args[-1]
        params_text = "..." if params is Ellipsis else ", ".join(format_type(p) for p in params)
        return f"Callable[[{params_text}], {format_type(result)}]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(format_type(a) for a in args)}]" if args else name
    if isinstance(typehint, type):
        return typehint.__name__
    return str(typehint).replace("typing.", "")


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default is None and type(action).__name__ in ("ActionConfigFile",):
        return "-"
    if action.default == argparse.SUPPRESS:
        return "-"
    return _code(format_value(action.default))


def _class_default(default: Any) -> str:
    if isinstance(default, dict) and "class_path" in default:
        text = _code(default["class_path"])
        init_args = default.get("init_args") or {}
        if init_args:
            text += f" with {_code(format_value(dict(init_args)))}"
        return text
    return "-" if default in (None, argparse.SUPPRESS) else _code(format_value(default))


def format_value(value: Any) -> str:
    """A default as YAML writes it in a config file (``null``, ``true``, ``[a, b]``, ``{lr: 0.001}``)."""
    import yaml

    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    except yaml.YAMLError:
        return str(value)
    text = text.strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text.strip() or "''"


def _api_page(cls: type, api_pages: set[str]) -> str | None:
    """``api/<package>.md`` of the package that defines ``cls``, where the site has one."""
    parts = getattr(cls, "__module__", "").split(".")
    if len(parts) >= 2 and parts[0] == "cosmos_pl":
        page = f"api/{parts[1]}.md"
        return page if page in api_pages else None
    return None


def _qualname(cls: type) -> str:
    module = getattr(cls, "__module__", "")
    return f"{module}.{cls.__qualname__}" if module and module != "builtins" else cls.__qualname__


# characters that markdown (emphasis, links, escapes, code spans) or a table (a cell's end) would read in a cell
_MARKDOWN_ENTITIES = {char: f"&#{ord(char)};" for char in "\\`*_[]|"}
# where code may wrap (docs/css/options.css keeps each piece between two of these whole): after a space, after
# one of ,/:|_ that no space follows, after a dot that no digit follows (0.001 stays whole)
_BREAKS = re.compile(r"(?<=[ ,/:|_])(?! )|(?<=\.)(?![\d ])")
# a flag named in prose (--overwrite, --data.num_clients): code, so that it never wraps at its dashes
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z](?:[\w.-]*\w)?)")  # not a sentence's full stop


def _code(text: str) -> str:
    """Text as code for a table cell, in HTML (a markdown code span cannot hold a break opportunity): one line,
    in pieces that end where ``_BREAKS`` matches; a piece never wraps (a browser would wrap at
    a ``-``: ``--`` / ``algorithm``), the code wraps only between pieces (``torch.optim.`` / ``Adam``)."""
    spans = []
    for piece in filter(None, _BREAKS.split(" ".join(text.split()))):
        escaped = "".join(_MARKDOWN_ENTITIES.get(char, html.escape(char, quote=False)) for char in piece)
        spans.append(f'<span class="piece">{escaped}</span>')
    return f"<code>{'<wbr>'.join(spans)}</code>"


def _inline(text: str) -> str:
    """Help text for a table cell: one line, with the characters markdown or a table would read escaped, its code
    spans and the flags it names as :func:`_code`, and each Sphinx role of the docstrings (``:class:`~a.b.C```)
    an optional cross-reference: a link where the site documents its target, else code (as
    docs/hooks/griffe_roles.py writes them in the API reference)."""
    from cosmos_pl.docstrings import replace_roles

    text = replace_roles(" ".join(text.split()), _autoref)
    # ``x`` (reStructuredText literals in the docstrings) and `x` are code; the cross-references' tags stay whole;
    # only the prose between them is escaped
    pieces = re.split(r"(``[^`]+``|`[^`]+`|<autoref [^<>]*>|</autoref>)", text)
    for i, piece in enumerate(pieces):
        if i % 2 == 1:
            pieces[i] = piece if piece.startswith("<") else _code(piece.strip("`"))
            continue
        prose = _FLAG.split(piece)
        for k, part in enumerate(prose):
            if k % 2 == 1:
                prose[k] = _code(part)
                continue
            part = part.replace("\\", "\\\\")
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            for char in "*_[]|":
                part = part.replace(char, "\\" + char)
            prose[k] = part
        pieces[i] = "".join(prose)
    return "".join(pieces)


def _autoref(role: Any) -> str:
    """A role (:class:`cosmos_pl.docstrings.Role`) as an optional cross-reference to its target, titled in code."""
    return f'<autoref identifier="{html.escape(role.target)}" optional>`{role.title}`</autoref>'
