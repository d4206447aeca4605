"""The README's headline figures are docs/benchmarks.md's "Headline figures" table, row for row (one source: a
figure changes there first), and every row names a bench or test that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| what | figure | reproduce with |"


def table(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_copies_the_benchmarks_headline_table() -> None:
    readme, benchmarks = table(ROOT / "README.md"), table(ROOT / "docs" / "benchmarks.md")
    assert len(readme) > 5
    assert readme == benchmarks, "README.md's headline table differs from docs/benchmarks.md's: copy it from there"


def test_every_headline_names_what_reproduces_it() -> None:
    for row in table(ROOT / "docs" / "benchmarks.md")[2:]:
        how = row.rstrip("|").rsplit("|", 1)[-1]
        paths = re.findall(r"((?:bench|tests)/[\w/]+\.py)", how)
        assert paths, f"no bench or test named in: {row}"
        for p in paths:
            assert (ROOT / p).exists(), f"{p} (named in the headline table) does not exist"
