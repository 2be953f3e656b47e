"""The imports among cosmos_pl's modules: the contracts in pyproject.toml (``[tool.importlinter]``: nothing imports
the command line, only it imports the Flower transport, compare's pairs and grid are independent, compare does not
import the round loop, the layers import downwards only), no module importing another's private names, and no import
cycle. Imports inside functions count everywhere."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

PACKAGE = "cosmos_pl"


def test_the_import_contracts_hold(repo_root):
    """``lint-imports`` (import-linter's console script, beside this Python) keeps every contract of pyproject.toml."""
    script = Path(sys.executable).parent / "lint-imports"
    assert script.is_file(), f"{script} is missing: install the test extra (pip install -e '.[test]')"
    done = subprocess.run([str(script), "--no-cache"], cwd=repo_root, capture_output=True, text=True)
    assert done.returncode == 0, f"lint-imports exit status {done.returncode}:\n{done.stdout}\n{done.stderr}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(path: Path, root: Path, modules: set[str]) -> list[str]:
    """Every import in ``path`` of a private name (or module) of another cosmos_pl module, as ``module:line: what``;
    also ``alias._name`` where ``alias`` is a cosmos_pl module it imported."""
    here = _module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found, aliases = [], {}
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != PACKAGE:
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{here}:{node.lineno}: import {alias.name}")
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            if any(_private(part) for part in source.split(".")):
                found.append(f"{here}:{node.lineno}: from {source} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{here}:{node.lineno}: from {source} import {alias.name}")
                elif f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and aliases[node.value.id] != here):
            found.append(f"{here}:{node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return found


def test_no_module_imports_a_private_name_of_another(repo_root):
    """A name that starts with ``_`` stays in its module: what another module needs is public (no underscore)."""
    files = sorted((repo_root / PACKAGE).rglob("*.py"))
    modules = {_module_name(f, repo_root) for f in files}
    found = [line for f in files for line in _private_imports(f, repo_root, modules)]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_no_import_cycles(repo_root):
    """No chain of imports leads from a cosmos_pl module back to itself (for every direct import A -> B, no chain
    B -> ... -> A)."""
    graph = grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)
    cycles = set()
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            chain = graph.find_shortest_chain(importer=imported, imported=importer)
            if chain:
                cycle = (importer, *chain)
                start = cycle.index(min(cycle[:-1]))  # the same cycle found from any of its modules: once
                cycles.add(" -> ".join(cycle[start:-1] + cycle[:start + 1]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))


def test_no_import_cycles_through_type_annotations():
    """Nor through imports made only for type annotations (under ``if TYPE_CHECKING:``): a module that needs
    another's type imports it, or a protocol of what it reads, one way only."""
    graph = grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=False)
    cycles = {" -> ".join((importer, *chain)) for importer in sorted(graph.modules)
              for imported in sorted(graph.find_modules_directly_imported_by(importer))
              for chain in [graph.find_shortest_chain(importer=imported, imported=importer)] if chain}
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))
