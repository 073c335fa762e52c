"""The key of edgefleet's own wheel (and so of the wheelhouse, the images and the bundle)
follows the sources the wheel is built from, and nothing the build leaves out."""

from __future__ import annotations

from pathlib import Path

import pytest

import edge_images.wheelhouse as wheelhouse


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'edgefleet'\n")
    for pkg in ("agent", "coordinator", "models", "edgefleet", "edgefleet_client"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(f"# {pkg}\n")
    monkeypatch.setattr(wheelhouse, "REPO", tmp_path)
    return tmp_path


def test_built_models_and_bytecode_do_not_change_the_key(repo: Path) -> None:
    before = wheelhouse.project_digest()
    # what every build and test run rewrites: the models' build report, bytecode
    artifacts = repo / "models" / "artifacts"
    (artifacts / "tiny-llama").mkdir(parents=True)
    (artifacts / "build-report.json").write_text('{"started_at": "2026-12-01T04:00:00"}')
    (artifacts / "tiny-llama" / "model.onnx").write_bytes(b"\0" * 1024)
    (repo / "agent" / "__pycache__").mkdir()
    (repo / "agent" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"pyc")
    assert wheelhouse.project_digest() == before
    (artifacts / "build-report.json").write_text('{"started_at": "2026-12-01T05:00:00"}')
    assert wheelhouse.project_digest() == before


def test_a_source_change_changes_the_key(repo: Path) -> None:
    before = wheelhouse.project_digest()
    (repo / "agent" / "sync.py").write_text("X = 1\n")
    after = wheelhouse.project_digest()
    assert after != before
    (repo / "agent" / "sync.py").write_text("X = 2\n")
    assert wheelhouse.project_digest() not in (before, after)
    # a folder named like a left-out one is only left out as a folder
    (repo / "models" / "artifacts.py").write_text("Y = 1\n")
    assert wheelhouse.project_digest() != after
