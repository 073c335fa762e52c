"""Small artifact directories for catalog tests: the real tiny-llama build manifest with
its files replaced by small ones (the coordinator stores and signs files, it never loads
them), so a test can publish several versions in milliseconds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MANIFEST = REPO_ROOT / "models" / "artifacts" / "tiny-llama" / "manifest.json"


def make_artifact(
    directory: Path,
    *,
    weights: bytes,
    tokenizer: bytes = b'{"tokenizer": "shared"}',
    gate_passed: bool | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Write an artifact directory; returns its manifest. ``weights`` decides the
    version (as the models build names it: variant + 12 hex of the graph's sha256)."""
    manifest = json.loads(TINY_MANIFEST.read_text(encoding="utf-8"))
    directory.mkdir(parents=True, exist_ok=True)
    contents = {"config.json": b'{"config": 1}', "model.onnx": weights, "tokenizer.json": tokenizer}
    files = []
    for path, data in contents.items():
        (directory / path).write_bytes(data)
        files.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    manifest["files"] = files
    graph_sha = hashlib.sha256(weights).hexdigest()
    manifest["version"] = version or f"{manifest['variant']}-{graph_sha[:12]}"
    if gate_passed is not None:
        manifest["accuracy"] = {
            "perplexity": 22.7 if not gate_passed else 13.1,
            "perplexity_ratio": 1.75 if not gate_passed else 1.01,
            "perplexity_ratio_max": 1.15,
            "factual_correct": 8 if not gate_passed else 18,
            "factual_total": 20,
            "passed": gate_passed,
        }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
