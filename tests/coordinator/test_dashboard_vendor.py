"""The dashboard's vendored assets (coordinator/api/static/vendor/): every file is the one
its manifest names by sha256, carries its licence, is packaged, and works under the page's
Content-Security-Policy (no eval). Neither CI nor a fresh clone needs npm; only
``python -m devtools.dashboard_vendor`` does, to change a version."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

from coordinator.api.dashboard import STATIC_DIR, VENDOR_DIR

REPO = Path(__file__).resolve().parents[2]
MANIFEST = json.loads((VENDOR_DIR / "MANIFEST.json").read_text())["files"]


def test_every_vendored_file_has_the_sha256_and_size_of_its_manifest() -> None:
    on_disk = {p.name for p in VENDOR_DIR.iterdir() if p.name != "MANIFEST.json"}
    assert on_disk == set(MANIFEST), "a file is missing from the manifest or the folder"
    for name, entry in MANIFEST.items():
        data = (VENDOR_DIR / name).read_bytes()
        assert len(data) == entry["bytes"], name
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{name} changed"


def test_each_file_names_its_package_and_a_licence_that_is_vendored_too() -> None:
    packages = {entry["package"] for entry in MANIFEST.values()}
    assert {p.split("@")[0] for p in packages} == {
        "d3-array", "d3-geo", "topojson-client", "uplot", "world-atlas",
    }  # fmt: skip
    for name, entry in MANIFEST.items():
        licence = VENDOR_DIR / entry["license_file"]
        assert licence.is_file(), name
        assert "Permission" in licence.read_text(), licence  # ISC and MIT both grant it
        assert entry["license"], name


def test_the_page_loads_only_local_files_that_exist() -> None:
    html = (STATIC_DIR / "index.html").read_text()
    refs = re.findall(r'<script src="([^"]+)"|<link rel="stylesheet" href="([^"]+)"', html)
    refs = [a or b for a, b in refs]
    assert refs, "no script or stylesheet found"
    for ref in refs:
        assert ref.startswith("/dashboard/"), ref  # nothing from another origin
        path = STATIC_DIR / ref.removeprefix("/dashboard/")
        assert path.is_file(), ref
    for name in ("d3-geo.min.js", "topojson-client.min.js", "uPlot.iife.min.js", "uPlot.min.css"):
        assert f'/dashboard/vendor/{name}"' in html
    for path in STATIC_DIR.glob("*.js"):
        text = path.read_text()
        assert "https://" not in text and "innerHTML" not in text, path
    assert "/dashboard/vendor/countries-110m.json" in (STATIC_DIR / "app.js").read_text()
    # what is preloaded is the coordinator's own API, as the script asks for it
    for href in re.findall(r'<link rel="preload" href="([^"]+)"', html):
        assert href.startswith("/v1/"), href


def test_vendored_scripts_need_no_eval_under_the_csp() -> None:
    for path in VENDOR_DIR.glob("*.js"):
        text = path.read_text()
        assert not re.search(r"\beval\s*\(|new Function\s*\(", text), path


def test_the_vendored_files_are_packaged() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["coordinator"]
    for path in [*STATIC_DIR.iterdir(), *VENDOR_DIR.iterdir()]:
        if path.is_file():
            relative = path.relative_to(STATIC_DIR.parent.parent).as_posix()
            assert any(Path(relative).match(p) for p in patterns), relative
