"""Fixtures for models/ tests: a tiny-llama artifact built once per session."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output dir holding a freshly built tiny-llama artifact (about 12 s)."""
    from models.build import build
    from models.context import BuildOptions

    out = tmp_path_factory.mktemp("artifacts")
    logging.getLogger("models").setLevel(logging.INFO)
    build(BuildOptions(out=out, only=("tiny-llama",), threads=2))
    return out
