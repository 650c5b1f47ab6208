"""The manual's shape, checked without building it (the build and the code blocks: tests/integration/test_docs.py).

* README.md is a front page: at most 300 lines, no dated measurement, no issue number, no machine-specific
  test report (a "2-core" timing); its relative links point at files that exist.
* Every page of docs/ is in mkdocs.yml's navigation, and every page the navigation names exists.
* Every page opens with its title and the lines on what it is for and when, before anything else.
* The generated reference pages keep their markers (the hooks replace them while the site builds).
"""

from __future__ import annotations

import re

import yaml

from tests import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"

DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b")
ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w/&])#\d+\b", re.I)
MACHINE = re.compile(r"\b\d+-core\b")


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return [p for item in node for p in _nav_pages(item)]


def _mkdocs() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=Loader)  # noqa: S506  (a safe loader)


def test_readme_is_a_front_page():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; the manual (docs/) holds the rest"
    for number, line in enumerate(lines, 1):
        assert not DATED.search(line), f"README.md:{number}: a dated measurement belongs in docs/benchmarks.md"
        assert not ISSUE.search(line), f"README.md:{number}: an issue number on the front page"
        assert not MACHINE.search(line), f"README.md:{number}: a machine-specific report belongs in docs/"


def test_the_checks_catch_what_they_are_for():
    assert DATED.search("measured on 2026-12-02") and ISSUE.search("(issue 26)") and ISSUE.search("see #31")
    assert MACHINE.search("on the 2-core machine") and not ISSUE.search("docs/results.md#the-toy-demo")


def test_readme_links_resolve():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (REPO_ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_every_page_is_in_the_navigation():
    nav = set(_nav_pages(_mkdocs()["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages <= nav, f"pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav <= pages, f"nav entries without a page: {sorted(nav - pages)}"


def test_every_page_opens_with_what_and_when():
    for page in DOCS.rglob("*.md"):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), f"{page}: the title comes first"
        opening = " ".join(lines[1:5])
        assert "What:" in opening and "When:" in opening, f"{page}: three lines on what and when open the page"


def test_reference_pages_keep_their_generator_markers():
    assert "<!-- generated: cli -->" in (DOCS / "reference" / "cli.md").read_text()
    config = (DOCS / "reference" / "config.md").read_text()
    assert "<!-- generated: config-schemas -->" in config and "<!-- generated: config-files -->" in config
    assert "::: recallm.recall.matcher" in (DOCS / "reference" / "api.md").read_text()


def test_the_command_reference_lists_old_names_as_renames(monkeypatch):
    # an old command name kept as an alias (MIGRATION.md) gets one line naming the new command, not a --help of
    # its own; read from the module's source, without importing the command (which loads torch)
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    import docs_hooks

    assert docs_hooks.renamed_to("recallm.cli.demo:main") == "recallm-decoding-demo"
    assert docs_hooks.renamed_to("recallm.cli.decoding_demo:main") is None
    assert docs_hooks.renamed_to("recallm.cli.sft:main") is None
    aliases = {name for name, entry in docs_hooks.console_scripts() if docs_hooks.renamed_to(entry)}
    assert aliases == {"recallm-demo"}
