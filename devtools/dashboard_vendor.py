"""``python -m devtools.dashboard_vendor``: refresh the dashboard's vendored assets.

The dashboard loads nothing from the internet and needs no build step, so the few
libraries it uses are committed under ``coordinator/api/static/vendor/`` with their
licences and ``MANIFEST.json`` (package, file inside the npm tarball, sha256, bytes,
licence of each file); ``tests/coordinator/test_dashboard_vendor.py`` checks the hashes,
so neither CI nor a fresh clone needs npm. Only this script does (``npm pack``), when a
version below changes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "coordinator" / "api" / "static" / "vendor"

# npm package -> (version, files taken from the tarball's package/ folder, licence of the
# code, what the package is for)
PACKAGES: dict[str, tuple[str, list[str], str, str]] = {
    "d3-array": ("3.2.5", ["dist/d3-array.min.js"], "ISC", "needed by d3-geo"),
    "d3-geo": ("3.1.2", ["dist/d3-geo.min.js"], "ISC", "map projection and paths"),
    "topojson-client": ("3.1.0", ["dist/topojson-client.min.js"], "ISC",
                        "TopoJSON to GeoJSON"),
    "uplot": ("1.6.32", ["dist/uPlot.iife.min.js", "dist/uPlot.min.css"], "MIT",
              "time-series charts"),
    "world-atlas": ("2.0.2", ["countries-110m.json"], "ISC; data: Natural Earth, public domain",
                    "country outlines, 1:110m"),
}  # fmt: skip


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_entry(name: str, package: str, version: str, source: str, licence: str,
                   licence_file: str) -> dict[str, object]:  # fmt: skip
    path = VENDOR / name
    return {"package": f"{package}@{version}", "source": source, "license": licence,
            "license_file": licence_file, "bytes": path.stat().st_size,
            "sha256": sha256(path)}  # fmt: skip


def main() -> int:
    VENDOR.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="edgefleet-vendor-") as tmp:
        for package, (version, wanted, licence, _why) in PACKAGES.items():
            print(f"npm pack {package}@{version}", flush=True)
            out = subprocess.run(
                ["npm", "pack", "--silent", f"{package}@{version}"], cwd=tmp, check=True,
                capture_output=True, text=True, timeout=300,
            ).stdout.split()[-1]  # fmt: skip
            unpacked = Path(tmp) / package
            with tarfile.open(Path(tmp) / out) as tar:
                tar.extractall(unpacked, filter="data")
            licence_file = f"LICENSE.{package}.txt"
            shutil.copyfile(unpacked / "package" / "LICENSE", VENDOR / licence_file)
            files[licence_file] = manifest_entry(
                licence_file, package, version, "LICENSE", licence, licence_file
            )
            for member in wanted:
                name = Path(member).name
                shutil.copyfile(unpacked / "package" / member, VENDOR / name)
                files[name] = manifest_entry(name, package, version, member, licence,
                                             licence_file)  # fmt: skip
    manifest = {"about": "Vendored dashboard assets from npm; written by "
                "python -m devtools.dashboard_vendor, checked by "
                "tests/coordinator/test_dashboard_vendor.py", "files": files}  # fmt: skip
    (VENDOR / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(files)} files and MANIFEST.json to {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
