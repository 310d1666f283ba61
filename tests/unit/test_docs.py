"""The receiving-webhooks page's test vector is the published one, and its FastAPI recipe
verifies it."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_vector_matches_the_published_vectors() -> None:
    page = (ROOT / "docs" / "receiving-webhooks.md").read_text()
    case = json.loads((ROOT / "tests" / "data" / "signature-vectors.json").read_text())["cases"][0]
    for value in (
        case["secret"],
        case["x_service_signature"],
        case["webhook_signature"],
        case["body"],
    ):
        assert value in page
    body = re.search(r"\| body \| `(.+?)` \|", page).group(1).encode()  # type: ignore[union-attr]
    assert (
        hmac.new(case["secret"].encode(), body, hashlib.sha256).hexdigest()
        == case["x_service_signature"]
    )


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    lines = page.read_text().splitlines()
    return {_slug(line.lstrip("#")) for line in lines if line.startswith("#")}


def test_readme_and_docs_links_resolve_inside_the_repository() -> None:
    """The repository stands alone: every relative link in the README, docs/ and bench/README
    names a file of the repository (never one beside it), and its #anchor a heading there."""
    pages = [
        ROOT / "README.md",
        ROOT / "bench" / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_docs_page_opens_with_a_title_and_is_linked_from_the_readme() -> None:
    """The README is the first page: it links every page of docs/, and each page says what it
    is in its first heading and the paragraph after it."""
    readme = (ROOT / "README.md").read_text()
    linked = {target.partition("#")[0] for target in _LINK.findall(readme)}
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2], page.name
        assert f"docs/{page.name}" in linked, page.name
