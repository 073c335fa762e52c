"""The graph writer on a Qwen2 decoder (q/k/v biases, RoPE base 1e6, untied head): a small
random Qwen2 from transformers, written by models.llama_graph and run by ONNX Runtime, gives
the logits transformers gives, from one pass and step by step through the KV cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.artifact import graph_io
from models.errors import ConversionError
from models.llama_graph import llm_spec, write_llama_gqa
from models.ort_llm import OrtDecoder

VOCAB = 320


def _qwen2(**overrides: Any) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config_cls: Any = Qwen2Config
    model_cls: Any = Qwen2ForCausalLM
    torch.manual_seed(0)
    config = config_cls(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=VOCAB, max_position_embeddings=256,
        rope_theta=1_000_000.0, tie_word_embeddings=False, **overrides,
    )  # fmt: skip
    model = model_cls(config)
    model.train(False)
    with torch.no_grad():  # transformers starts biases at zero: make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    return model


def _torch_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return np.asarray(logits.numpy(), dtype=np.float32)


def test_qwen2_graph_matches_transformers(tmp_path: Path) -> None:
    model = _qwen2()
    assert any(n.endswith("q_proj.bias") for n, _ in model.named_parameters())
    path = write_llama_gqa(model, tmp_path / "model.onnx")
    graph = graph_io(path)
    decoder = OrtDecoder(path, llm_spec(model.config, graph.inputs, graph.outputs), threads=1)
    ids = [5, 17, 250, 3, 99, 42, 7, 318, 64, 1, 2, 200]
    expected = _torch_logits(model, ids)

    logits, _ = decoder.forward(ids, decoder.empty_past(), 0)
    np.testing.assert_allclose(logits, expected, atol=2e-4, rtol=1e-3)

    # the same positions through the cache: a prefill of 7, then one token at a time
    logits, past = decoder.forward(ids[:7], decoder.empty_past(), 0)
    rows = [logits]
    for i in range(7, len(ids)):
        step, past = decoder.forward([ids[i]], past, i)
        rows.append(step)
    np.testing.assert_allclose(np.concatenate(rows), expected, atol=2e-4, rtol=1e-3)

    # the biases and the head are in the graph as the checkpoint has them
    import onnx

    names = {i.name for i in onnx.load(str(path)).graph.initializer}
    assert "/model.layers.0/attn/qkv_proj.bias" in names and "lm_head.weight" in names


def test_without_its_biases_the_graph_would_differ(tmp_path: Path) -> None:
    """The bias Add is what makes the match: zeroing the biases changes the logits."""
    import torch

    model = _qwen2()
    ids = [5, 17, 250, 3, 99]
    with_biases = _torch_logits(model, ids)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.zero_()
    assert np.abs(_torch_logits(model, ids) - with_biases).max() > 1e-2


def test_sliding_window_attention_is_refused(tmp_path: Path) -> None:
    model = _qwen2(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    with pytest.raises(ConversionError, match="sliding-window"):
        write_llama_gqa(model, tmp_path / "model.onnx")
