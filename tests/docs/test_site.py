"""The docs site builds offline with mkdocs (strict: a warning fails it) and every internal
link of the built HTML resolves, anchors included; the READMEs' relative links name files
that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]


class _Page(HTMLParser):
    """The ids and the links (tag, attribute, value) of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.duplicate_ids: list[str] = []
        self.links: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" and value in self.ids:
                self.duplicate_ids.append(value)
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            if name in ("href", "src"):
                self.links.append((tag, value))


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def broken_links(site: Path) -> list[str]:
    """Every internal link of the site's HTML that names a missing file or anchor, and
    every asset (script, stylesheet, image) loaded from elsewhere; ids used twice."""
    parsed: dict[Path, _Page] = {}

    def page(path: Path) -> _Page:
        if path not in parsed:
            found = _Page()
            found.feed(path.read_text(encoding="utf-8", errors="replace"))
            parsed[path] = found
        return parsed[path]

    problems = []
    for html in sorted(site.rglob("*.html")):
        where = html.relative_to(site)
        problems += [f"{where}: two elements with id {dup!r}" for dup in page(html).duplicate_ids]
        for tag, link in page(html).links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                if tag in ("script", "link", "img") and parts.scheme in ("http", "https", ""):
                    problems.append(f"{where}: <{tag}> loads {link} from elsewhere")
                continue
            if parts.path:
                # 404.html links from the site's root (mkdocs knows no other place for it)
                base = site if parts.path.startswith("/") else html.parent
                target = (base / unquote(parts.path).lstrip("/")).resolve()
                if target.is_dir() or parts.path.endswith("/"):
                    target = target / "index.html"
            else:
                target = html
            if not target.is_file() or site.resolve() not in target.parents:
                problems.append(f"{where}: {link} -> no such file")
                continue
            anchor = unquote(parts.fragment)
            if anchor and target.suffix == ".html" and anchor not in page(target).ids:
                problems.append(f"{where}: {link} -> no anchor #{anchor}")
    return problems


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return out


def test_the_site_builds_strict_and_offline(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "operators" / "runbook" / "index.html").is_file()
    assert (site / "reference" / "coordinator-http-api" / "index.html").is_file()
    # no web fonts: the theme's font is off, so no page asks Google for one
    for html in site.rglob("*.html"):
        assert "fonts.googleapis.com" not in html.read_text(encoding="utf-8"), html


def test_every_internal_link_and_anchor_resolves(site: Path) -> None:
    problems = broken_links(site)
    assert not problems, "broken links in the built site:\n" + "\n".join(problems)


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="a/">ok</a><a href="a/#here">ok</a><a href="b/">missing</a>'
        '<a href="a/#nowhere">missing anchor</a><a href="#top" id="top">self</a>'
        '<script src="https://cdn.example/x.js"></script><a href="https://example.org">ok</a>'
    )
    (tmp_path / "a" / "index.html").write_text('<h2 id="here">Here</h2><p id="here"></p>')
    assert broken_links(tmp_path) == [
        "a/index.html: two elements with id 'here'",
        "index.html: b/ -> no such file",
        "index.html: a/#nowhere -> no anchor #nowhere",
        "index.html: <script> loads https://cdn.example/x.js from elsewhere",
    ]


@pytest.mark.parametrize("readme", ["README.md", "benchmarks/README.md"])
def test_readme_links_name_files_that_exist(readme: str) -> None:
    path = REPO / readme
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        if urlsplit(target).scheme:
            continue
        assert (path.parent / target).exists(), f"{readme} links to {target}, which is missing"
