"""The documentation site (mkdocs.yml, docs/): it builds with no warning, README stays a short front page that names
pages which exist, and the option reference, generated from the parsers at build time, lists their options."""

import argparse
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import PROCESS_TIMEOUT_S

# its module fixture is made once, on one worker (`pytest --dist loadgroup`, as `make test` runs it)
pytestmark = pytest.mark.xdist_group("docs")

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

for _package in ("mkdocs", "material", "mkdocstrings_handlers.python"):  # the `docs` extra (make test installs it)
    pytest.importorskip(_package, reason="the docs extra is not installed: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with --strict: any warning (a broken link or anchor, a docstring the
    API reference cannot read, an option table that fails) fails the build."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}\n{proc.stdout}"
    return out


def test_site_builds_with_no_warning(site):
    for page in ("index.html", "guide/index.html", "options/index.html", "api/algorithms/index.html"):
        assert (site / page).is_file(), page


# a Sphinx role printed as written: ":class:" before the code span markdown makes of its target
PRINTED_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|obj|exc|const|type|ref):")


class _Prose(HTMLParser):
    """A page's text outside code, scripts and styles (code may show a role's syntax on purpose)."""

    _SKIPPED = {"code", "pre", "script", "style"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        self._depth += tag in self._SKIPPED

    def handle_endtag(self, tag):
        self._depth -= tag in self._SKIPPED and self._depth > 0

    def handle_data(self, data):
        if not self._depth:
            self.parts.append(data)


def printed_roles(html: str) -> list[str]:
    """Each role a page prints as written, with the text around it."""
    parser = _Prose()
    parser.feed(html)
    text = " ".join("".join(parser.parts).split())
    return [text[max(0, m.start() - 50): m.end() + 50] for m in PRINTED_ROLE.finditer(text)]


def test_printed_roles_finds_a_role_outside_code():
    # as markdown renders an unread role: the role's name, then its target as code
    assert printed_roles("<p>raises :class:<code>~cosmos_pl.errors.ConfigError</code> when</p>") == [
        "raises :class: when"]
    assert printed_roles("<p>the syntax <code>:class:`~a.B`</code>; <a href='#a.B'><code>B</code></a></p>") == []


def test_no_page_prints_a_sphinx_role(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, pages  # every page of the nav, the API reference's included
    printed = [f"{page.relative_to(site)}: ...{snippet}..." for page in pages
               for snippet in printed_roles(page.read_text(encoding="utf-8"))]
    assert not printed, f"{len(printed)} roles printed as written:\n" + "\n".join(printed[:40])


def test_roles_link_to_what_the_site_documents(site):
    # cosmos_pl/errors.py's docstring names :class:`UserError` (relative: resolved in its module), and
    # cosmos_pl.cli.main's :class:`~cosmos_pl.errors.UserError`: both a link to the class on the same page
    html = (site / "api" / "core" / "index.html").read_text(encoding="utf-8")
    link = re.compile(r'<a class="autorefs autorefs-internal"[^>]*href="#cosmos_pl\.errors\.UserError"[^>]*>'
                      r"<code>UserError</code></a>")
    assert len(link.findall(html)) >= 2


def test_griffe_extension_writes_roles_as_optional_cross_references():
    """docs/hooks/griffe_roles.py: a role becomes an optional autoref to its target's full path (a link where the
    site renders the target, code where not), a relative target resolved in the docstring's scope."""
    import griffe

    extensions = griffe.load_extensions(str(ROOT / "docs" / "hooks" / "griffe_roles.py"))
    modules = {
        "__init__.py": '"""Holds :class:`~pkg.tools.Tool` and :mod:`os.path`."""\n',
        "tools.py": ('class Tool:\n    """Runs :meth:`Tool.run` and :func:`helper`."""\n\n'
                     '    def run(self):\n        """Calls :func:`~pkg.tools.helper`, not ``:func:`x```."""\n\n\n'
                     'def helper():\n    """Helps :class:`Tool`."""\n'),
    }
    with griffe.temporary_visited_package("pkg", modules, extensions=extensions) as pkg:
        def ref(path, title):
            return f'<autoref identifier="{path}" optional>`{title}`</autoref>'

        assert pkg.docstring.value == f"Holds {ref('pkg.tools.Tool', 'Tool')} and {ref('os.path', 'os.path')}."
        tools = pkg["tools"]
        assert tools["Tool"].docstring.value == (f"Runs {ref('pkg.tools.Tool.run', 'Tool.run')} and "
                                                  f"{ref('pkg.tools.helper', 'helper')}.")
        assert tools["Tool.run"].docstring.value == f"Calls {ref('pkg.tools.helper', 'helper')}, not ``:func:`x```."
        assert tools["helper"].docstring.value == f"Helps {ref('pkg.tools.Tool', 'Tool')}."


def test_option_tables_keep_each_flag_on_one_line(site):
    """The option tables sit in blocks of class option-table, which the site's CSS keeps from wrapping."""
    html = (site / "options" / "index.html").read_text(encoding="utf-8")
    assert html.count('<div class="option-table">') >= 10, "the option tables lost their option-table block"
    css = (site / "css" / "options.css").read_text()
    assert re.search(r"\.option-table td:first-child[^{]*\{[^}]*white-space:\s*nowrap", css), css
    assert 'href="../css/options.css"' in html


def _options_hook():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks_options", ROOT / "docs" / "hooks" / "options.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_option_table_code_wraps_only_between_names():
    hook = _options_hook()
    piece = '<span class="piece">{}</span>'.format
    assert hook._code("torch.optim.Adam") == (
        f"<code>{piece('torch.')}<wbr>{piece('optim.')}<wbr>{piece('Adam')}</code>")
    # 0.001 stays whole; | is an entity (a table would end the cell at it), _ too (markdown emphasis)
    assert hook._code("{lr: 0.001} | a_b") == (
        f"<code>{piece('{lr: ')}<wbr>{piece('0.001} ')}<wbr>{piece('&#124; ')}<wbr>{piece('a&#95;')}<wbr>"
        f"{piece('b')}</code>")
    # a flag the help names is code (a browser would break prose at its dashes); a role a cross-reference
    assert hook._inline("unless --overwrite true (:class:`~a.B`), sbatch --gpus-per-node.") == (
        f"unless <code>{piece('--overwrite')}</code> true "
        f'(<autoref identifier="a.B" optional><code>{piece("B")}</code></autoref>), sbatch '
        f"<code>{piece('--gpus-per-node')}</code>.")


def test_readme_is_a_short_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move the details into docs/"


def test_readme_names_docs_pages_that_exist():
    named = set(re.findall(r"docs/[\w./-]+?\.md", README.read_text()))
    assert named, "README names no docs page"
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"README names docs pages that do not exist: {missing}"


def _settings(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> flag of every setting a parser takes (not --help, a group's config loader or a class's --X.help)."""
    out = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or type(action).__name__ == "_ActionConfigLoad":
            continue
        if action.dest.endswith(".help") and action.dest[: -len(".help")] in {a.dest for a in parser._actions}:
            continue
        out[action.dest] = action.option_strings[0]
    return out


def test_option_reference_lists_every_option_of_the_parsers(site):
    from cosmos_pl.parsers import build_compare_parser, build_fit_parser

    html = (site / "options" / "index.html").read_text()
    fit, compare = _settings(build_fit_parser()), _settings(build_compare_parser())
    # the parsers themselves: a test that cannot pass on an empty list
    assert {"seed", "rounds", "data.num_clients", "algorithm", "trainer.precision"} <= set(fit)
    assert {"jobs", "out", "grid"} <= set(compare) - set(fit)
    for flag in list(fit.values()) + [compare[d] for d in set(compare) - set(fit)]:
        assert f"<code>{flag}</code>" in html, f"{flag} is missing from the option reference"
    assert "<!-- options:" not in html, "a marker line was left unreplaced"
