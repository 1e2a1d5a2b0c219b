"""Every relative link in the project's Markdown resolves: the file exists, and a #fragment
names a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces to
hyphens). Web links are not fetched (CI has no network). Exit 1 listing the broken ones."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
SKIP_DIRS = {".venv", ".venv-newest", "node_modules", "test-artifacts", "build"}


def markdown_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md")
                  if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
                  and not any(part.startswith(".") for part in p.relative_to(ROOT).parts))


def prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks (a link in a code sample is not a link)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose_lines(path):
        if line.startswith("#"):
            base, n = anchor(line.lstrip("#")), 0
            while (base if n == 0 else f"{base}-{n}") in found:  # repeated headings get -1, -2
                n += 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links() -> list[str]:
    broken = []
    for md in markdown_files():
        for line in prose_lines(md):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path_part, _, fragment = target.partition("#")
                dest = (md.parent / path_part).resolve() if path_part else md
                where = f"{md.relative_to(ROOT)}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    broken.append(f"{where}: no heading #{fragment}")
    return broken


if __name__ == "__main__":
    problems = broken_links()
    for problem in problems:
        print(problem)
    print(f"links: {len(problems)} broken in {len(markdown_files())} Markdown files")
    sys.exit(1 if problems else 0)
