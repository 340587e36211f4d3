"""Every relative link in README.md and docs/*.md resolves: the file exists, and an ``#anchor`` names a heading.

Anchors are GitHub's heading slugs: the heading's text lower-cased, every character that is not a letter, a digit,
a space, ``-`` or ``_`` dropped, spaces turned into ``-``; a repeated slug gets ``-1``, ``-2``, ... Links inside
fenced code blocks and inline code are not links. No imports beyond the standard library.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markdown links and emphasis reduced to their text first)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(_prose_lines(path.read_text(encoding="utf-8")), 1):
        for match in _LINK.finditer(_INLINE_CODE.sub("", line)):
            found.append((number, match.group(1)))
    return found


def _broken(page: Path) -> list[str]:
    problems = []
    for _number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            problems.append(f"{page.relative_to(ROOT)}: link {target!r}: no such file")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix != ".md":
                problems.append(f"{page.relative_to(ROOT)}: link {target!r}: an anchor into a non-markdown target")
            elif anchor not in anchors(dest):
                problems.append(f"{page.relative_to(ROOT)}: link {target!r}: no heading with that anchor")
    return problems


def test_slugs_follow_github():
    assert slug("The CPU demo") == "the-cpu-demo"
    assert slug("Search (UOPD's third benchmark)") == "search-uopds-third-benchmark"
    assert slug("`actfirst.compare`: method tables") == "actfirstcompare-method-tables"
    assert slug("One node, and several") == "one-node-and-several"


def test_the_pages_exist():
    assert (ROOT / "docs" / "README.md").exists()
    assert len(PAGES) > 2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert _broken(page) == []


def test_every_docs_page_is_in_the_index():
    index = {target.partition("#")[0] for _, target in links(ROOT / "docs" / "README.md")}
    missing = [p.name for p in PAGES if p.parent.name == "docs" and p.name != "README.md" and p.name not in index]
    assert missing == []


def test_readme_opens_with_the_two_commands():
    head = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:12])
    assert "actfirst.run" in head and "scripts/test.sh" in head


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 220
