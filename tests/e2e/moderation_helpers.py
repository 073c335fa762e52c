"""Shared by the moderation end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path

from models.moderation_spec import BUNDLED_HEADS_DIR, BUNDLED_HEADS_KEY


def without_heads(source: Path, out: Path) -> Path:
    """The MiniLM artifact ``source`` as a build from before bundling wrote it: the same
    files (linked), no moderation/ and a manifest that does not list it."""
    out.mkdir(parents=True)
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.pop(BUNDLED_HEADS_KEY, None)
    manifest["files"] = [
        f for f in manifest["files"] if not f["path"].startswith(BUNDLED_HEADS_DIR + "/")
    ]
    for entry in manifest["files"]:
        (out / entry["path"]).symlink_to(source / entry["path"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out
