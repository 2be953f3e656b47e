"""The documentation site (mkdocs.yml, docs/): it builds with no warning, README stays a short front page that names
pages which exist, and the option reference, generated from the parsers at build time, lists their options."""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}\n{proc.stdout}"
    return out


def test_site_builds_with_no_warning(site):
    for page in ("index.html", "guide/index.html", "options/index.html", "api/algorithms/index.html"):
        assert (site / page).is_file(), page


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
