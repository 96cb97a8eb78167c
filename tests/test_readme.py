"""The README speaks to a newcomer: short, two Quickstart commands that exist, links that resolve.

The rest of the documentation is the mkdocs site under docs/ (`make docs`, run by `make test`,
builds it with --strict, so a broken link there fails the test command); the README lives
outside that site, so its links are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(heading: str) -> str:
    """The README's text under ``## heading``, up to the next ``## `` heading."""
    return README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def commands(text: str) -> list[str]:
    """Every command in the text's ```bash blocks, comments and blank lines left out."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", makefile, flags=re.M)}


def test_the_readme_stays_under_300_lines() -> None:
    assert len(README.splitlines()) < 300


def test_the_quickstart_is_two_commands_the_makefile_has() -> None:
    quickstart = section("Quickstart")
    assert commands(quickstart) == ["make demo", "make test"]
    assert {"demo", "test", "check"} <= make_targets()
    assert "`make check`" in quickstart  # the quicker loop is named in the text, not in the block


def test_make_test_builds_the_docs_strictly() -> None:
    """CI runs `make test` (.ci/run); the docs build is part of it, so a broken docs link fails CI."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^test:.*\bdocs\b", makefile, flags=re.M)
    assert re.search(r"^docs:.*\n\t.*mkdocs build --strict", makefile, flags=re.M)


def test_the_readmes_links_resolve() -> None:
    """Every relative link of the README and of benchmarks' READMEs (all outside the docs site)
    names a file or folder of the checkout, and every ``#anchor`` into a page names one of its
    headings (GitHub's slugs, as mkdocs makes them)."""
    broken = []
    rooms = sorted((ROOT / "benchmarks").glob("*/README.md"))  # one per benchmark room
    for readme in (ROOT / "README.md", ROOT / "benchmarks" / "README.md", *rooms):
        for target in re.findall(r"\]\(([^)\s]+)\)", readme.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            page = (readme.parent / path).resolve()
            if not page.exists():
                broken.append(f"{readme.relative_to(ROOT)}: {target}")
            elif anchor:
                headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append(f"{readme.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_docs_page_the_readme_links_is_in_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {t.split("#")[0].removeprefix("docs/") for t in re.findall(r"\]\((docs/[^)\s]+\.md)", README)}
    assert pages and all(page in nav for page in pages)
