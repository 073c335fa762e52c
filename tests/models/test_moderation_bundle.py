"""The heads bundle themselves into the MiniLM artifact they were trained on
(``models.build_moderation.attach_heads``, run by every build, cached or not): listed in
its manifest with their sha256, named in ``moderation_heads``, MiniLM's version unchanged;
a second run changes nothing; heads of another MiniLM version are refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models.build_moderation import EMBEDDING_MODEL, NAME, attach_heads
from models.errors import SourceError
from models.manifest import load_manifest, sha256_file, verify_files
from models.moderation_spec import BUNDLED_HEADS_DIR, BUNDLED_HEADS_KEY
from tests.conftest import ARTIFACTS, REPO
from tests.e2e.moderation_helpers import without_heads


@pytest.fixture(scope="module")
def built() -> Path:
    subprocess.run(
        [sys.executable, "-m", "models", "build", "--out", str(ARTIFACTS), "--only",
         EMBEDDING_MODEL, NAME],
        cwd=REPO, check=True, timeout=1800,
    )  # fmt: skip
    return ARTIFACTS


@pytest.fixture
def out(built: Path, tmp_path: Path) -> Path:
    """An output directory with MiniLM as a build before bundling left it, and the heads."""
    without_heads(built / EMBEDDING_MODEL, tmp_path / EMBEDDING_MODEL)
    shutil.copytree(built / NAME, tmp_path / NAME)
    return tmp_path


def test_the_heads_are_bundled_into_minilm_and_listed_in_its_manifest(out: Path) -> None:
    before = load_manifest(out / EMBEDDING_MODEL)
    assert attach_heads(out) is True
    after = load_manifest(out / EMBEDDING_MODEL)
    heads = load_manifest(out / NAME)
    assert (after.version, after.build_key) == (before.version, before.build_key)
    listed = {e.path: e.sha256 for e in after.files}
    for entry in heads.files:
        assert listed[f"{BUNDLED_HEADS_DIR}/{entry.path}"] == entry.sha256
    assert listed[f"{BUNDLED_HEADS_DIR}/manifest.json"] == sha256_file(out / NAME / "manifest.json")
    verify_files(after, out / EMBEDDING_MODEL)  # every listed file there, hashes right
    raw = json.loads((out / EMBEDDING_MODEL / "manifest.json").read_text())
    assert raw[BUNDLED_HEADS_KEY] == {
        "name": NAME, "version": heads.version, "manifest": f"{BUNDLED_HEADS_DIR}/manifest.json"
    }  # fmt: skip
    assert attach_heads(out) is False  # already bundled: nothing rewritten


def test_heads_of_another_minilm_version_are_refused(out: Path) -> None:
    path = out / EMBEDDING_MODEL / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["version"] = "int8-000000000000"
    path.write_text(json.dumps(manifest))
    with pytest.raises(SourceError, match="rebuild them"):
        attach_heads(out)
    assert not (out / EMBEDDING_MODEL / BUNDLED_HEADS_DIR).exists()
