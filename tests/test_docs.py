"""The documentation holds together: README.md stays a front door a newcomer reads top to bottom
(at most 350 lines, with an index of docs/), and every relative link in README.md, docs/ and
scripts/README.md reaches a file that exists, and a heading there when it names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 350

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?!\n))*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def documents() -> list[Path]:
    """The pages a reader follows links through (generated bench reports included)."""
    pages = [README, ROOT / "scripts" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in pages if page.exists()]


def links(page: Path) -> list[str]:
    """Link targets written in `page`, outside code blocks and code spans."""
    text = _INLINE_CODE.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page` (lower case, punctuation dropped, spaces
    to hyphens, a repeated heading numbered)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    result = set()
    for heading in _HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    return broken


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into a docs/ page"


@pytest.mark.parametrize("page", documents(), ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_readme_indexes_every_docs_page():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "bench" / "README.md"]
    missing = [str(page.relative_to(ROOT)) for page in pages if page.resolve() not in linked]
    assert missing == [], f"README.md's documentation index does not link {missing}"


def test_link_checker_sees_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# A heading: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-heading-with-code) [gone](missing.md) [bad anchor](other.md#nope)\n"
        "```\n[in code](also-missing.md)\n```\n[web](https://example.com) `[span](x.md)`\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nope (no such heading)"]
