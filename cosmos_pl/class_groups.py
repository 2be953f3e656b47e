"""Class-path settings (``algorithm``, ``data.dataset``, ``data.partitioner``, the optimizers): a class chosen in a
config file or on the command line starts from its own defaults.

jsonargparse keeps the previous class's init_args that the newly chosen class also accepts (jsonargparse#460,
Lightning-AI/pytorch-lightning#15796): ``--config cosmos.yaml --algorithm COMET`` would run COMET with COSMOS's
``lambda_: 5.0`` instead of COMET's own 1.0, and a config file naming ``cosmos_pl.data.Dirichlet`` would inherit
the default partitioner's ``alpha``. :func:`class_args` reads the same sources jsonargparse reads (config files and
flags, left to right) and appends, for every group whose class was chosen, one last flag that sets the group
completely: the chosen class's own defaults, then the settings given for that class after it was chosen, then the
settings given on the command line for the group anywhere (``--algorithm.ptc_epochs 2 --algorithm FedMD`` keeps
``ptc_epochs`` for FedMD, which does not take it: an error naming it). jsonargparse then parses and checks that
flag as any other, so types, help and ``--print_config`` stay its own.

Nested groups (COSMOS's ``teacher_optimizer``) follow the same rule inside their class.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib
import inspect
import typing
from pathlib import Path
from typing import Any, Optional

import yaml
from jsonargparse import ArgumentParser, get_loader

from cosmos_pl.errors import ConfigError

__all__ = ["class_args", "parse_args", "group_keys", "algorithm_named"]

_NO_VALUE = {"-h", "--help", "--print_config"}  # flags that take no separate value (``--print_config=x`` form aside)


def group_keys(parser: ArgumentParser) -> dict[str, Any]:
    """The parser's class-path groups (their default is a class spec, or their type a class): dotted key -> the
    type hint jsonargparse built the group from."""
    from jsonargparse.typehints import ActionTypeHint

    defaults = _plain_defaults(parser)
    return {a.dest: a._typehint for a in parser._actions if isinstance(a, ActionTypeHint) and (
        _is_spec(_at(defaults, a.dest)[1]) or ActionTypeHint.is_subclass_typehint(a._typehint, all_subtypes=False))}


def _plain_defaults(parser: ArgumentParser) -> dict[str, Any]:
    """The parser's defaults as plain values, computed once per parser (a dump is slow enough to
    count at start-up, docs/performance.md)."""
    cached = getattr(parser, "_cosmos_plain_defaults", None)
    if cached is None:
        cached = yaml.safe_load(parser.dump(parser.get_defaults(), skip_check=True, skip_none=False))
        parser._cosmos_plain_defaults = cached
    return copy.deepcopy(cached)


@functools.lru_cache(maxsize=None)
def _defaults(hint: Any, class_path: str, required: str = "{}") -> Optional[dict[str, Any]]:
    """``{"class_path": full path, "init_args": {...}}`` with the class's own defaults (a parser with nothing before
    the class, so nothing is inherited); ``required`` (YAML): values for init args without a default. None when
    the class cannot be built from these (jsonargparse then names what is missing)."""
    p = ArgumentParser(exit_on_error=False)
    p.add_argument("--group", type=hint)
    given = yaml.safe_load(required)
    value = class_path if not given else yaml.safe_dump({"class_path": class_path, "init_args": given})
    try:
        spec = yaml.safe_load(p.dump(p.parse_args(["--group", value]), skip_none=False))["group"]
    except Exception:  # a required init arg missing, a class that does not import: the real parse says which
        return None
    if isinstance(spec, str):
        spec = {"class_path": spec}
    spec.setdefault("init_args", {})
    return spec


def _is_spec(value: Any) -> bool:
    return isinstance(value, dict) and ("class_path" in value or "init_args" in value)


def _class_of(value: Any) -> Optional[str]:
    """The class a value names (a class path or name, or a spec's ``class_path``), or None."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value.get("class_path")
    return None


def _same_class(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two class names denote the same class (``COMET``, ``cosmos_pl.algorithms.COMET`` and
    ``cosmos_pl.algorithms.comet.COMET`` do)."""
    return a is not None and b is not None and a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


def _init_of(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        if "class_path" in value or "init_args" in value:
            return copy.deepcopy(value.get("init_args") or {})
        return copy.deepcopy(value)  # init_args given without a class_path
    return {}


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Deep-merge init_args ``new`` into ``into``; a nested group given another class replaces the old one."""
    for k, v in new.items():
        old = into.get(k)
        if _is_spec(old) and (_is_spec(v) or isinstance(v, str)):
            cls = _class_of(v)
            if cls is not None and not _same_class(cls, old.get("class_path")):
                into[k] = copy.deepcopy(v) if isinstance(v, dict) else {"class_path": v}
            else:
                _merge(old.setdefault("init_args", {}), _init_of(v))
        elif _is_spec(old) and isinstance(v, dict):  # init_args of a nested group given without its class_path
            _merge(old.setdefault("init_args", {}), v)
        elif isinstance(old, dict) and isinstance(v, dict) and not _is_spec(v):
            _merge(old, v)
        else:
            into[k] = copy.deepcopy(v)


def _set_path(into: dict[str, Any], path: list[str], value: Any) -> None:
    """Set init arg ``path`` (its ``init_args`` segments dropped) to ``value``, as ``--group.a.b value`` does."""
    head, rest = path[0], path[1:]
    if not rest:
        _merge(into, {head: value})
    elif rest == ["class_path"]:
        _merge(into, {head: {"class_path": value}})
    else:
        node = into.get(head)
        if _is_spec(node):
            node = node.setdefault("init_args", {})
        elif not isinstance(node, dict):
            node = into[head] = {}
        _set_path(node, rest, value)


def _tokens(argv: list[str]) -> list[tuple[str, Any, int]]:
    """``argv`` as (key, raw value, index of the value in ``argv``), in order; a flag without a value has None."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("--"):
            continue
        if "=" in tok:
            key, value = tok[2:].split("=", 1)
            out.append((key, value, i - 1))
        elif tok in _NO_VALUE or i >= len(argv) or argv[i].startswith("--"):
            out.append((tok[2:], None, -1))
        else:
            out.append((tok[2:], argv[i], i))
            i += 1
    return out


def _config_source(value: str) -> dict[str, Any]:
    """A ``--config`` value as jsonargparse reads it: a YAML file, or YAML text; {} when it is neither (the
    parser names the missing file)."""
    load = get_loader("yaml")
    path = Path(value).expanduser()
    try:
        text = path.read_text() if path.is_file() else value
        loaded = load(text)
    except (OSError, yaml.YAMLError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _at(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _resolve_algorithm(name: str, key: str) -> str:
    """An algorithm given by short name (``fedmd``) or class name (``FedMD``, any case) as its class path; a
    dotted path is kept as it is.

    Raises:
        ConfigError: an unknown name, suggesting the closest valid one and listing all.
    """
    from cosmos_pl.algorithms import ALGORITHMS

    if "." in name:
        return name
    names = {**{n: n for n in ALGORITHMS}, **{c.__name__.lower(): n for n, c in ALGORITHMS.items()}}
    short = names.get(name.lower())
    if short is None:
        close = difflib.get_close_matches(name.lower(), list(names), n=1)
        hint = f"did you mean {names[close[0]]!r}? " if close else ""
        raise ConfigError(f"{key}={name!r}: unknown algorithm; {hint}valid names are "
                          f"{', '.join(f'{n} ({c.__name__})' for n, c in ALGORITHMS.items())}")
    return f"cosmos_pl.algorithms.{ALGORITHMS[short].__name__}"


def algorithm_named(name: str, key: str) -> Any:
    """The class ``--algorithm`` takes ``name`` for (short name, class name in any case, or class path); None for a
    dotted path that names no class (jsonargparse then says what is wrong with it).

    Raises:
        ConfigError: an unknown short or class name, suggesting the closest valid one and listing all.
    """
    return _import_class(_resolve_algorithm(name, key))


def _complete(hint: Any, class_path: str, explicit: dict[str, Any], key: str) -> dict[str, Any]:
    """The class's own defaults with ``explicit`` init_args over them, nested groups completed the same way.

    Raises:
        ConfigError: an init arg the class does not take, naming it and the ones it takes.
    """
    cls = _import_class(class_path)
    takes = _init_params(cls)
    short = class_path.rsplit(".", 1)[-1]
    for k, v in explicit.items():
        if takes is not None and k not in takes:
            close = difflib.get_close_matches(k, takes, n=1)
            hint_text = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{key}.init_args.{k}={v!r}: {short} takes no setting {k!r} (a class chosen in a config "
                              f"or on the command line starts from its own defaults); {hint_text}its settings are "
                              f"{', '.join(takes) or 'none'}: drop it, or choose a class that takes it")
    plain = {k: v for k, v in explicit.items() if not _is_spec(v)}  # what an init arg without a default may need
    spec = _defaults(hint, class_path) or _defaults(hint, class_path, yaml.safe_dump(plain))
    if spec is None:  # cannot be completed here: jsonargparse parses what was given and names what is missing
        return {"class_path": class_path, "init_args": explicit}
    init = copy.deepcopy(spec["init_args"])
    hints = _init_hints(cls)
    for k, v in explicit.items():
        old = init.get(k)
        if k in hints and (_is_spec(v) or (_is_spec(old) and isinstance(v, (str, dict)))):  # a nested group
            cls_k = _class_of(v) if isinstance(v, str) or _is_spec(v) else None
            if cls_k is not None and not (_is_spec(old) and _same_class(cls_k, old.get("class_path"))):
                init[k] = _complete(hints[k], cls_k, _init_of(v), f"{key}.init_args.{k}")  # its own defaults
            elif _is_spec(old):
                _merge(old.setdefault("init_args", {}), _init_of(v))
            else:
                init[k] = v
        else:
            init[k] = v
    return {"class_path": spec["class_path"], "init_args": init}


def _import_class(path: str) -> Any:
    """The class a class path names (a bare name is looked up by jsonargparse; None here)."""
    if "." not in path:
        return None
    module, name = path.rsplit(".", 1)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _init_params(cls: Any) -> Optional[list[str]]:
    """The init args ``cls`` takes, or None when any is accepted (``**kwargs``) or it cannot be known."""
    if cls is None:
        return None
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _init_hints(cls: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # a class whose annotations cannot be evaluated here: no nested groups to complete
        return {}


def class_args(parser: ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` (one subcommand's arguments) plus one ``--<group> <spec>`` flag per class-path group whose class
    a config file or a flag chose, so that the class starts from its own defaults (see the module docstring).

    An algorithm may be named by its short name (``--algorithm fedmd``) or class name (``--algorithm FedMD``).

    Raises:
        ConfigError: an unknown algorithm name (with the closest valid one and the list), or a setting given on
            the command line that the chosen class does not take.
    """
    if any(tok in ("-h", "--help") for tok in argv):
        return argv
    groups = group_keys(parser)
    load = get_loader("yaml")
    events: dict[str, list[tuple[str, Any]]] = {key: [] for key in groups}
    argv = list(argv)
    longest_first = sorted(groups, key=len, reverse=True)
    for key, raw, index in _tokens(argv):
        if key == "config" and raw is not None:
            tree = _config_source(raw)
            for group in groups:
                found, value = _at(tree, group)
                if found:
                    events[group].append(("set", value))
            continue
        group = next((g for g in longest_first if key == g or key.startswith(g + ".")), None)
        if group is None or raw is None:
            continue
        value = load(raw)
        path = [s for s in key[len(group) + 1:].split(".") if s != "init_args"] if key != group else []
        if path == ["class_path"]:
            value, path = {"class_path": value}, []
        if path:
            events[group].append(("flag", (path, value)))
            continue
        if group == "algorithm" and isinstance(_class_of(value), str):
            resolved = _resolve_algorithm(_class_of(value), group)
            if isinstance(value, str):  # jsonargparse would refuse a short name before reaching the spec below
                value = resolved
                argv[index] = resolved if argv[index] == raw else argv[index].replace(raw, resolved)
            else:
                value = {**value, "class_path": resolved}
        events[group].append(("set", value))
    defaults = _plain_defaults(parser)
    extra: list[str] = []
    for group, evs in events.items():
        if evs:
            spec = _fold(group, groups[group], _at(defaults, group)[1], evs)
            if spec is not None:
                extra += [f"--{group}", yaml.safe_dump(spec, default_flow_style=True, width=1 << 30).strip()]
    return argv + extra


def _fold(group: str, hint: Any, default: Any, events: list[tuple[str, Any]]) -> Optional[dict[str, Any]]:
    """Replay one group's settings in order; returns its complete spec when a class was chosen (the group's, or
    a nested group's), else None (jsonargparse's own result is then right)."""
    cls = _class_of(default)
    explicit = _init_of(default)
    from_flags: list[tuple[list[str], Any]] = []
    switched = False
    for kind, value in events:
        before = copy.deepcopy(explicit)
        if kind == "set":
            new = _class_of(value)
            if group == "algorithm" and new is not None:
                new = _resolve_algorithm(new, group)
            if new is not None and not _same_class(new, cls):
                cls, explicit, switched = new, _init_of(value), True
                for path, v in from_flags:  # settings typed on the command line hold for whichever class is chosen
                    _set_path(explicit, path, v)
                continue
            _merge(explicit, _init_of(value))
        else:
            path, v = value
            _set_path(explicit, path, v)
            from_flags.append((path, v))
        switched = switched or _nested_switch(before, explicit)
    if not switched or cls is None:
        return None
    return _complete(hint, cls, explicit, group)


def _nested_switch(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether a nested group changed class between ``before`` and ``after`` (its old init_args must go)."""
    for k, v in after.items():
        old = before.get(k)
        if _is_spec(v) and _is_spec(old):
            if v.get("class_path") and not _same_class(v.get("class_path"), old.get("class_path")):
                return True
            if _nested_switch(old.get("init_args") or {}, v.get("init_args") or {}):
                return True
    return False


def parse_args(parser: ArgumentParser, argv: list[str]) -> Any:
    """``parser.parse_args`` of ``argv`` with :func:`class_args` applied (a YAML text is given as ``["--config",
    text]``).

    Raises:
        ConfigError: see :func:`class_args`; jsonargparse's ArgumentError for anything else it refuses.
    """
    return parser.parse_args(class_args(parser, argv))
