"""The README and docs/ link to each other: every relative link must reach a
file that exists and, with a #fragment, a heading of that file (as GitHub
makes anchors of headings). The README keeps the test command CI runs in its
first code block, and each task page opens with an example before its first
section."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# pages written before the one-page-per-task layout, kept as they are
REFERENCE_PAGES = {"README.md", "design.md", "trace-format.md"}

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text):
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchors(path):
    """GitHub's anchors of a markdown file's headings: lower case, punctuation
    other than - and _ dropped, spaces as -, a repeated one numbered."""
    seen, out = {}, set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path):
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):     # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page):
    broken = []
    for target in links(page):
        file, _, fragment = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_are_closed_once(page):
    fences = [line for line in page.read_text().splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0 and "```\n```\n" not in page.read_text()


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    listed = {t for t in links(ROOT / "docs" / "README.md") if "#" not in t}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= listed, f"not in docs/README.md: {sorted(pages - listed)}"
    assert index.count("\n- [") == len(pages)


def test_the_readme_starts_with_the_two_commands():
    first_block = re.search(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M).group(1)
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == \
        ["pip install . && python -m vramguard demo", "make test"]


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in REFERENCE_PAGES], ids=lambda p: p.name)
def test_each_task_page_opens_with_an_example(page):
    """A title, what the reader wants to do, then an example: a code block
    before the page's first section."""
    text = page.read_text()
    assert text.startswith("# ")
    first_section = re.search(r"^## ", text, re.M)
    opening = text[:first_section.start()] if first_section else text
    assert "\n```" in opening, f"{page.name}: no example before its first section"
