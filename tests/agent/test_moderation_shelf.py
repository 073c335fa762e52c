"""The agent's moderation heads follow the embedding model version it serves
(``agent.moderation.ModerationShelf``): heads bundled in a version's artifact load with it,
a hot swap to a version with its own heads switches the classifier, a swap to one without
heads leaves none (and says which version lacks them), and heads in the layout beside the
models are read only for the version they were trained on."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.model_registry import ModelRegistry
from agent.moderation import ModerationShelf
from models.build_moderation import EMBEDDING_MODEL, NAME
from models.manifest import load_manifest
from tests.conftest import ARTIFACTS, REPO
from tests.e2e.moderation_helpers import without_heads


@dataclass
class Served:
    """Stands for a served embedding model: the shelf reads its name and version only."""

    model_id: str
    version: str


@pytest.fixture(scope="module")
def built() -> Path:
    subprocess.run(
        [sys.executable, "-m", "models", "build", "--out", str(ARTIFACTS), "--only",
         EMBEDDING_MODEL, NAME],
        cwd=REPO, check=True, timeout=1800,
    )  # fmt: skip
    return ARTIFACTS


def registry_serving(version: str) -> ModelRegistry:
    return ModelRegistry({}, {EMBEDDING_MODEL: Served(EMBEDDING_MODEL, version)})  # type: ignore[dict-item]


def test_the_classifier_follows_a_hot_swap(built: Path, tmp_path: Path) -> None:
    directory = built / EMBEDDING_MODEL
    manifest = load_manifest(directory)
    registry = registry_serving(manifest.version)
    shelf = ModerationShelf(registry)
    assert shelf.current()[0] is None  # nothing loaded through the shelf yet
    shelf.add(directory, manifest)
    first, why_not = shelf.current()
    assert first is not None and why_not == ""
    assert first.name == NAME

    # swapped to a version without heads: no classifier, and the version is named
    bare = without_heads(directory, tmp_path / "bare")
    bare_manifest = load_manifest(bare)
    shelf.add(bare, bare_manifest)
    registry.swap_embedding(Served(EMBEDDING_MODEL, "int8-00000000000b"))  # type: ignore[arg-type]
    classifier, why_not = shelf.current()
    assert classifier is None
    assert f"{EMBEDDING_MODEL}@int8-00000000000b has no moderation heads" in why_not

    # swapped back: the version's own heads again
    registry.swap_embedding(Served(EMBEDDING_MODEL, manifest.version))  # type: ignore[arg-type]
    assert shelf.current() == (first, "")


def test_heads_bundled_under_another_catalog_version_name_score_it(built: Path) -> None:
    """A catalog may publish the artifact under another version name: its bundled heads
    are for the version they came with, whatever it is called."""
    directory = built / EMBEDDING_MODEL
    manifest = load_manifest(directory)
    renamed = manifest.__class__(**{**manifest.__dict__, "version": "int8-0000000000aa"})
    shelf = ModerationShelf(registry_serving("int8-0000000000aa"))
    shelf.add(directory, renamed)
    classifier, why_not = shelf.current()
    assert classifier is not None, why_not


def test_heads_beside_the_models_only_for_the_version_they_were_trained_on(
    built: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    without_heads(built / EMBEDDING_MODEL, models / EMBEDDING_MODEL)
    (models / "moderation").mkdir()
    (models / NAME).symlink_to(built / NAME)
    version = load_manifest(built / EMBEDDING_MODEL).version
    shelf = ModerationShelf(registry_serving(version))
    shelf.add_from_dir(models)
    assert shelf.current()[0] is not None
    other = ModerationShelf(registry_serving("int8-0000000000cc"))
    other.add_from_dir(models)
    classifier, why_not = other.current()
    assert classifier is None and "were trained on" in why_not
