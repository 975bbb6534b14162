"""The README and docs/: every relative link and anchor resolves, the README stays short and speaks to
users (no internal machine letters or issue numbers), and code cites docs/, not README headings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
RUN_NOTES = sorted((ROOT / "docs" / "results").rglob("README.md"))   # each run's own story, commands and machine
DOCS = [ROOT / "README.md", *PAGES, *RUN_NOTES]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks (a ``# comment`` there is no heading, a ``[x](y)`` no link)."""
    return re.sub(r"(?ms)^```.*?^```", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"(?m)^#{1,6} (.+)$", prose(path.read_text()))}


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):          # http(s), mailto: not checked offline
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"{target} (no such heading)")
    return bad


def test_every_relative_link_and_anchor_resolves():
    bad = {p.name: b for p in DOCS if (b := broken_links(p))}
    assert not bad, bad


def test_the_link_checker_sees_broken_links(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n[ok](#title-here) [gone](b.md) [no](#nowhere)\n"
                                   "```\n[in code](c.md)\n```\n")
    assert broken_links(tmp_path / "a.md") == ["b.md (no such file)", "#nowhere (no such heading)"]


def test_docs_pages_are_references_of_300_lines_at_most():
    """A page is looked things up in; the story of how a number was found lives in its run's README."""
    long = {p.name: n for p in PAGES if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long


def test_every_results_folder_a_page_links_is_there():
    linked = set()
    for page in [ROOT / "README.md", *PAGES]:
        linked |= set(re.findall(r"\(((?:docs/)?results/[^)#\s]+)", prose(page.read_text())))
    assert linked, "no page links a run"
    missing = [t for t in linked if not (ROOT / ("" if t.startswith("docs/") else "docs") / t).exists()]
    assert not missing, missing


def test_readme_is_short_and_for_users():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    assert not re.findall(r"machine [A-D]\b|issue [0-9]", text)


def test_code_cites_docs_not_the_readme():
    for path in (ROOT / "src" / "reform").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"README[\"' ]|DESIGN\.md", text), f"{path} cites the README or a missing file"


def method_table(path: Path) -> set[str]:
    """The method names in the first column of ``path``'s table headed ``| method |``."""
    lines = prose(path.read_text()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    names = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def test_the_method_tables_name_exactly_the_registered_methods():
    """Adding a method is its file, one registry line and its rows here: the README's and methods.md's
    tables list every method `--method` takes, and nothing else."""
    from reform.methods import REGISTRY
    for page in (ROOT / "README.md", ROOT / "docs" / "methods.md"):
        assert method_table(page) == set(REGISTRY), page.name
