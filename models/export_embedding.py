"""Export a sentence-embedding encoder (BERT family) to ONNX and embed text with it.

The graph outputs ``last_hidden_state``; a sentence embedding is its attention-mask weighted
mean over tokens, L2-normalised (what sentence-transformers does for all-MiniLM-L6-v2).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from models._quiet import offline_env, quiet
from models.errors import ConversionError

__all__ = [
    "embed",
    "export_feature_extraction",
    "mean_pool_normalize",
    "torch_reference_embeddings",
    "write_tokenizer",
]

log = logging.getLogger(__name__)


def export_feature_extraction(model_dir: Path, out_dir: Path) -> Path:
    """Export ``model_dir`` (HF checkpoint) to ``out_dir/model.onnx`` for feature extraction."""
    offline_env()
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet():
        from optimum.exporters.onnx import main_export

        try:
            main_export(
                str(model_dir),
                output=str(out_dir),
                task="feature-extraction",
                device="cpu",
                dtype="fp32",
                do_validation=False,
                local_files_only=True,
                library_name="transformers",  # the package also looks like sentence-transformers
            )
        except Exception as exc:  # library boundary
            raise ConversionError(f"optimum export of {model_dir} failed: {exc}") from exc
    graphs = sorted(p.name for p in out_dir.glob("*.onnx"))
    if graphs != ["model.onnx"]:
        raise ConversionError(f"expected a single model.onnx from optimum, got {graphs}")
    return out_dir / "model.onnx"


def write_tokenizer(src: Path, dst: Path, max_length: int) -> Any:
    """Copy a tokenizers JSON with truncation at ``max_length`` and no fixed padding."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(src))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    tokenizer.save(str(dst))
    return tokenizer


def mean_pool_normalize(
    hidden: npt.NDArray[np.float32], mask: npt.NDArray[np.int64]
) -> npt.NDArray[np.float32]:
    """Attention-mask weighted mean over tokens, then L2 normalisation."""
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    norm = np.linalg.norm(pooled, axis=1, keepdims=True)
    result: npt.NDArray[np.float32] = pooled / np.clip(norm, 1e-12, None)
    return result


def embed(session: Any, tokenizer: Any, sentences: list[str]) -> npt.NDArray[np.float32]:
    """Pooled, normalised embeddings of ``sentences`` through an ONNX Runtime session."""
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(sentences, add_special_tokens=True)
    tokenizer.no_padding()
    ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
    mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": mask}
    names = {i.name for i in session.get_inputs()}
    if "token_type_ids" in names:
        feed["token_type_ids"] = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
    (hidden,) = session.run(["last_hidden_state"], feed)
    return mean_pool_normalize(hidden, mask)


def torch_reference_embeddings(
    model_dir: Path, tokenizer: Any, sentences: list[str]
) -> npt.NDArray[np.float32]:
    """The same embeddings computed by transformers in torch (checks the export)."""
    offline_env()
    with quiet():
        import torch
        from transformers import AutoModel

        model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        encodings = tokenizer.encode_batch(sentences, add_special_tokens=True)
        tokenizer.no_padding()
        ids = torch.tensor([e.ids for e in encodings])
        mask = torch.tensor([e.attention_mask for e in encodings])
        types = torch.tensor([e.type_ids for e in encodings])
        with torch.no_grad():
            hidden = model(
                input_ids=ids, attention_mask=mask, token_type_ids=types
            ).last_hidden_state
    return mean_pool_normalize(hidden.numpy(), mask.numpy())
