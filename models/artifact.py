"""Write an artifact directory: its files, then a manifest describing exactly those files.

A directory is staged next to its final place and swapped in only when complete, so a reader
never sees a half-written artifact.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from models.errors import ConversionError
from models.manifest import (
    MANIFEST_FILENAME,
    FileEntry,
    GraphSpec,
    ModelManifest,
    sha256_file,
    write_manifest,
)

__all__ = [
    "dir_size",
    "external_data_locations",
    "file_entries",
    "graph_io",
    "graph_version",
    "install_dir",
    "onnx_files",
    "stage_dir",
]

log = logging.getLogger(__name__)


def graph_io(onnx_path: Path) -> GraphSpec:
    """Input and output names of a graph, read without loading external weights."""
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # library boundary
        raise ConversionError(f"cannot read ONNX graph {onnx_path}: {exc}") from exc
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(i.name for i in model.graph.input if i.name not in initializers)
    outputs = tuple(o.name for o in model.graph.output)
    return GraphSpec(onnx=onnx_path.name, inputs=inputs, outputs=outputs)


def external_data_locations(onnx_path: Path) -> list[str]:
    """The external-data files ``onnx_path``'s tensors name (relative to its directory), in
    order of first use."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # library boundary
        raise ConversionError(f"cannot read ONNX graph {onnx_path}: {exc}") from exc
    tensors = [*model.graph.initializer]
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    found = [ExternalDataInfo(t).location for t in tensors if uses_external_data(t)]
    return list(dict.fromkeys(found))


def onnx_files(directory: Path, graph: str = "model.onnx") -> list[Path]:
    """The graph file followed by its external-data files (sorted)."""
    main = directory / graph
    extra = sorted(
        p for p in directory.iterdir() if p.is_file() and p.name.startswith(graph) and p != main
    )
    return [main, *extra]


def graph_version(
    directory: Path,
    variant: str,
    graph: str = "model.onnx",
    *,
    file_sha256: dict[str, str] | None = None,
) -> str:
    """``<variant>-<12 hex>`` where the hex is sha256 over the graph and its external data.

    With ``file_sha256``, each of those files' own sha256 is recorded there too (by name),
    from the same read, for :func:`file_entries`.
    """
    digest = hashlib.sha256()
    for path in onnx_files(directory, graph):
        own = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
                own.update(chunk)
        if file_sha256 is not None:
            file_sha256[path.relative_to(directory).as_posix()] = own.hexdigest()
    return f"{variant}-{digest.hexdigest()[:12]}"


def file_entries(
    directory: Path, known_sha256: Mapping[str, str] | None = None
) -> tuple[FileEntry, ...]:
    """Every file under ``directory`` except manifest.json, with size and sha256.

    Digests in ``known_sha256`` (relative path -> hex) are used instead of rehashing.
    """
    known = known_sha256 or {}
    entries = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST_FILENAME:
            continue
        sha256 = known.get(rel) or sha256_file(path)
        entries.append(FileEntry(path=rel, sha256=sha256, size=path.stat().st_size))
    return tuple(entries)


def dir_size(directory: Path) -> int:
    """Total bytes of the files under ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def stage_dir(final: Path) -> Path:
    """A fresh, empty staging directory beside ``final``."""
    staging = final.with_name(f".{final.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def install_dir(staging: Path, final: Path, manifest: ModelManifest) -> ModelManifest:
    """Fill in files/version of ``manifest`` from ``staging``, write it, swap into ``final``."""
    for required in (manifest.graph.onnx, manifest.tokenizer.file):
        if not (staging / required).is_file():
            raise ConversionError(f"{staging}: {required} was not written")
    # the graph's weights outside it must be files of the artifact (so the manifest lists
    # and hashes them, and the version covers them): beside the graph, named like it
    graph_files = {p.name for p in onnx_files(staging, manifest.graph.onnx)}
    for location in external_data_locations(staging / manifest.graph.onnx):
        if location not in graph_files or not (staging / location).is_file():
            raise ConversionError(
                f"{staging / manifest.graph.onnx}: its external data {location!r} is not a "
                f"{manifest.graph.onnx}* file of the artifact"
            )
    # the graph files are large: hash each once, for the version and for its file entry
    graph_sha256: dict[str, str] = {}
    version = graph_version(
        staging, manifest.variant, manifest.graph.onnx, file_sha256=graph_sha256
    )
    complete = replace(manifest, files=file_entries(staging, graph_sha256), version=version)
    write_manifest(complete, staging)
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    log.info("wrote %s (%s, %.1f MB)", final, complete.version, dir_size(final) / 1e6)
    return complete


def copy_files(paths: Iterable[Path], directory: Path) -> None:
    """Copy files (flat) into ``directory``."""
    for path in paths:
        shutil.copy2(path, directory / path.name)
