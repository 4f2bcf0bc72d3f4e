"""Every `design.md §N` cited anywhere in the repo names a section that docs/design.md has.

About 200 comments, error messages and docs cite the design by section number. A renumbered or
missing section would leave them pointing nowhere, so the numbering is checked here: no server,
no network, only the files of the checkout.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"

SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".sh", ".toml", ".cfg", ".txt"}
NAMES = {"Dockerfile", "Makefile"}
SKIPPED_DIRS = {".git", ".venv", "node_modules", "cdk.out", "__pycache__", ".mypy_cache", ".ruff_cache"}

SECTION_ID = r"[0-9]+(?:\.[0-9]+|[a-z])?"
# A heading of design.md: "## 2. The lease protocol", "### 2a. `connection` mode", "### 4.1 `seqfeed/1`".
HEADING = re.compile(rf"^#{{2,3}} ({SECTION_ID})\.?\s", re.MULTILINE)
# A citation and the sections listed right after it: "design.md §2a", "design.md §2.0, §2d",
# "design.md §4.1–§4.5", "docs/design.md §2c and §2e".
CITATION = re.compile(rf"design\.md((?:\s*(?:,|;|/|–|-|and|or)?\s*§\s*{SECTION_ID})+)")
SECTION = re.compile(rf"§\s*({SECTION_ID})")

# The numbering that about 200 citations rely on: none of these may disappear or be renumbered.
REQUIRED = [
    "1",
    "2",
    "2.0",
    "2a",
    "2b",
    "2c",
    "2d",
    "2e",
    "3",
    "4",
    "4.1",
    "4.2",
    "4.3",
    "4.4",
    "4.5",
    "5",
    "6",
    "7",
    "8",
    "9",
    "10",
]


def design_sections(text: str) -> set[str]:
    return set(HEADING.findall(text))


def cited_sections(text: str) -> list[str]:
    return [section for match in CITATION.finditer(text) for section in SECTION.findall(match.group(1))]


def repo_files() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]  # never walk the venv or node_modules
        for name in files:
            path = Path(folder, name)
            if path.suffix in SUFFIXES or name in NAMES:
                yield path


def citations() -> dict[str, list[str]]:
    """{"path:line": [section, ...]} for every citation of design.md in the repo."""
    found: dict[str, list[str]] = {}
    for path in repo_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            sections = cited_sections(line)
            if sections:
                found[f"{path.relative_to(ROOT)}:{number}"] = sections
    return found


def test_design_md_has_the_numbered_sections_the_repo_relies_on() -> None:
    missing = [number for number in REQUIRED if number not in design_sections(DESIGN.read_text())]
    assert not missing, f"docs/design.md lacks sections {missing}"


def test_every_cited_section_exists_in_design_md() -> None:
    sections = design_sections(DESIGN.read_text())
    found = citations()
    # The repo cites the design about 200 times: finding few means the scan itself is broken.
    assert sum(len(cited) for cited in found.values()) >= 100, f"only {len(found)} citations found"
    dangling = [f"{where} cites §{s}" for where, cited in found.items() for s in cited if s not in sections]
    assert not dangling, "citations of sections docs/design.md does not have:\n" + "\n".join(dangling)


def test_design_md_cites_only_its_own_sections() -> None:
    text = DESIGN.read_text()
    sections = design_sections(text)
    dangling = sorted({s for s in SECTION.findall(text) if s not in sections})
    assert not dangling, f"docs/design.md refers to §{dangling}, which it does not have"


def test_the_citation_pattern_reads_lists_and_ranges() -> None:
    assert cited_sections("see docs/design.md §2a, §2e and §4.1.") == ["2a", "2e", "4.1"]
    assert cited_sections("(design.md §4.1–§4.5)") == ["4.1", "4.5"]
    assert cited_sections("design.md §3. Then §9 of STYLE.md") == ["3"]
    assert cited_sections("STYLE.md §11") == []
