"""Write a Llama-family decoder as an ONNX graph with fused grouped-query attention.

The exporter's graph (optimum) spells attention out: concatenate the past, expand the key
and value heads to the query heads, two MatMuls, a mask. On this CPU that plumbing cost as
much as the weights in a batched decode step. This module writes the graph ONNX Runtime
runs best instead, the way onnxruntime-genai's model builder does, straight from the
Hugging Face weights:

- ``com.microsoft.GroupQueryAttention`` per layer, rotary embedding inside, with a key/value
  cache that may be one preallocated buffer the kernel writes into (past and present bound
  to the same memory), rows of different lengths told apart by ``seqlens_k``;
- fused RMS norms (``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``
  carrying the residual), one MatMul for q/k/v and one for gate/up, ``QuickGelu`` (alpha 1)
  as SiLU;
- the LM head only at the positions asked for (``logits_index``): a step needs one row of
  logits per sequence, not one per prompt token.

Qwen2 (``model_type`` qwen2) is the same decoder with biases on q, k and v: one Add after the
fused q/k/v MatMul. Its RoPE base comes from the config (``rope_theta``: 1e6 for
Qwen2.5-Coder) like any Llama's, and its head is written as the checkpoint has it (an untied
``lm_head``; a tied one is untied before, see :func:`models.export_llm.load_gguf_model_untied`).

Inputs: ``input_ids`` [batch, seq] int64; ``seqlens_k`` [batch] int32 (each row's total
tokens, cache included, minus one); ``total_sequence_length`` int32 scalar (the longest row's
total); ``logits_index`` [batch, k] int64 (positions within ``input_ids`` whose logits to
return); ``past_key_values.{i}.key|value`` [batch, kv_heads, buffer, head_dim]. Outputs:
``logits`` [batch, k, vocab] and ``present.{i}.key|value``.

Weights are written as float32 MatMuls; quantization is a later step
(:mod:`models.quantize`), as for any other graph.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from models.errors import ConversionError
from models.export_llm import PAST_KEY, PAST_VALUE, PRESENT_KEY, PRESENT_VALUE
from models.manifest import LlmSpec

__all__ = ["GRAPH_INPUTS", "llm_spec", "write_llama_gqa"]

log = logging.getLogger(__name__)

GRAPH_INPUTS = ("input_ids", "seqlens_k", "total_sequence_length", "logits_index")


def _config_ints(config: Any) -> tuple[int, int, int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return layers, heads, kv_heads, head_dim, int(config.vocab_size)


def llm_spec(config: Any, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> LlmSpec:
    """Shapes from the HF config, checked against the graph's tensor names."""
    layers, heads, kv_heads, head_dim, vocab = _config_ints(config)
    expected_in = set(GRAPH_INPUTS)
    expected_out = {"logits"}
    for layer in range(layers):
        expected_in |= {PAST_KEY.format(layer=layer), PAST_VALUE.format(layer=layer)}
        expected_out |= {PRESENT_KEY.format(layer=layer), PRESENT_VALUE.format(layer=layer)}
    missing = (expected_in - set(inputs)) | (expected_out - set(outputs))
    if missing:
        raise ConversionError(f"graph lacks expected tensors: {sorted(missing)[:6]}")
    return LlmSpec(
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        past_key_template=PAST_KEY,
        past_value_template=PAST_VALUE,
        present_key_template=PRESENT_KEY,
        present_value_template=PRESENT_VALUE,
        uses_position_ids=False,
    )


def _rope_cache(config: Any, head_dim: int) -> tuple[npt.NDArray[np.float32], ...]:
    scaling = getattr(config, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise ConversionError(f"rope scaling {scaling} is not supported by this graph writer")
    theta = float(getattr(config, "rope_theta", 10000.0))
    positions = int(config.max_position_embeddings)
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    freqs = np.outer(np.arange(positions, dtype=np.float64), inv)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def write_llama_gqa(model: Any, out_path: Path) -> Path:
    """Write ``model`` (a transformers LlamaForCausalLM, float32, untied head) to ``out_path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    config = model.config
    model_type = getattr(config, "model_type", "llama")
    if model_type not in ("llama", "qwen2"):
        raise ConversionError(f"model type {config.model_type!r} is not a Llama decoder")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ConversionError("attention/MLP biases are not supported by this graph writer")
    if getattr(config, "use_sliding_window", False):
        raise ConversionError("sliding-window attention is not supported by this graph writer")
    layers, heads, kv_heads, head_dim, vocab = _config_ints(config)
    hidden = int(config.hidden_size)
    eps = float(config.rms_norm_eps)
    weights = {k: v.detach().to("cpu").float().numpy() for k, v in model.state_dict().items()}

    inits: list[Any] = []
    nodes: list[Any] = []

    def init(name: str, array: npt.NDArray[Any]) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> None:
        domain = "com.microsoft" if op in _MS_OPS else ""
        nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))

    def linear(x: str, weight_names: list[str], name: str) -> str:
        # HF stores [out, in]; a MatMul wants [in, out]. Several projections of the same
        # input become one MatMul (columns side by side).
        w = np.concatenate([weights[n].T for n in weight_names], axis=1)
        out = f"{name}/output_0"
        node("MatMul", [x, init(f"{name}.weight", w)], [out], name=f"{name}/MatMul")
        biases = [n.removesuffix(".weight") + ".bias" for n in weight_names]
        if model_type == "qwen2" and any(b in weights for b in biases):
            # Qwen2's q/k/v biases, side by side as the weights are
            b = np.concatenate([weights[n] for n in biases])
            biased = f"{name}/Add/output_0"
            node("Add", [out, init(f"{name}.bias", b)], [biased], name=f"{name}/Add")
            return biased
        return out

    cos, sin = _rope_cache(config, head_dim)
    init("cos_cache", cos)
    init("sin_cache", sin)
    node("Gather", [init("model.embed_tokens.weight", weights["model.embed_tokens.weight"]),
                    "input_ids"], ["embeddings"], name="/model/embed_tokens/Gather")  # fmt: skip

    residual = "embeddings"
    pending: str | None = None  # output to add to the residual before the next norm
    for i in range(layers):
        p = f"model.layers.{i}"
        x, residual = _norm(node, init, weights, f"{p}.input_layernorm", residual, pending, eps)
        qkv = linear(x, [f"{p}.self_attn.{w}_proj.weight" for w in "qkv"], f"/{p}/attn/qkv_proj")
        attn = f"/{p}/attn/output_0"
        node(
            "GroupQueryAttention",
            [qkv, "", "", PAST_KEY.format(layer=i), PAST_VALUE.format(layer=i), "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"],
            [attn, PRESENT_KEY.format(layer=i), PRESENT_VALUE.format(layer=i)],
            name=f"/{p}/attn/GroupQueryAttention",
            num_heads=heads, kv_num_heads=kv_heads, do_rotary=1, rotary_interleaved=0,
        )  # fmt: skip
        pending = linear(attn, [f"{p}.self_attn.o_proj.weight"], f"/{p}/attn/o_proj")
        x, residual = _norm(
            node, init, weights, f"{p}.post_attention_layernorm", residual, pending, eps
        )
        gate_up = linear(x, [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"],
                         f"/{p}/mlp/gate_up_proj")  # fmt: skip
        size = int(weights[f"{p}.mlp.gate_proj.weight"].shape[0])
        gate, up = f"/{p}/mlp/gate", f"/{p}/mlp/up"
        node("Split", [gate_up, init(f"/{p}/mlp/split_sizes", np.array([size, size]))],
             [gate, up], name=f"/{p}/mlp/Split", axis=-1)  # fmt: skip
        silu, act = f"/{p}/mlp/silu", f"/{p}/mlp/act"
        node("QuickGelu", [gate], [silu], name=f"/{p}/mlp/QuickGelu", alpha=1.0)
        node("Mul", [silu, up], [act], name=f"/{p}/mlp/Mul")
        pending = linear(act, [f"{p}.mlp.down_proj.weight"], f"/{p}/mlp/down_proj")
    normed, _ = _norm(node, init, weights, "model.norm", residual, pending, eps)

    node("Unsqueeze", ["logits_index", init("/lm_head/axes", np.array([-1]))],
         ["/lm_head/index"], name="/lm_head/Unsqueeze")  # fmt: skip
    node("GatherND", [normed, "/lm_head/index"], ["/lm_head/hidden"], name="/lm_head/GatherND",
         batch_dims=1)  # fmt: skip
    node("MatMul", ["/lm_head/hidden", init("lm_head.weight", weights["lm_head.weight"].T)],
         ["logits"], name="/lm_head/MatMul")  # fmt: skip

    f, i32, i64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence"]),
        helper.make_tensor_value_info("seqlens_k", i32, ["batch"]),
        helper.make_tensor_value_info("total_sequence_length", i32, []),
        helper.make_tensor_value_info("logits_index", i64, ["batch", "positions"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", f, ["batch", "positions", vocab])]
    kv_shape: list[str | int | None] = ["batch", kv_heads, "past_sequence", head_dim]
    for layer in range(layers):
        for name in (PAST_KEY, PAST_VALUE):
            inputs.append(helper.make_tensor_value_info(name.format(layer=layer), f, kv_shape))
        for name in (PRESENT_KEY, PRESENT_VALUE):
            outputs.append(helper.make_tensor_value_info(
                name.format(layer=layer), f, ["batch", kv_heads, "present_sequence", head_dim]
            ))  # fmt: skip
    graph = helper.make_graph(nodes, "llama_gqa", inputs, outputs, initializer=inits)
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        producer_name="edgefleet.models.llama_graph",
    )
    onnx_model.ir_version = 9
    out_path.parent.mkdir(parents=True, exist_ok=True)
    weight_bytes = sum(len(t.raw_data) for t in inits)
    if weight_bytes < _EXTERNAL_DATA_BYTES:
        onnx.save(onnx_model, str(out_path))
    else:  # a protobuf holds at most 2 GB: Qwen2.5-0.5B in fp32 is 2.5 GB
        onnx.save(onnx_model, str(out_path), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=f"{out_path.name}.data")  # fmt: skip
    log.info("wrote %s: %d layers, hidden %d, %d nodes", out_path, layers, hidden, len(nodes))
    return out_path


#: Weights over this size go to ``<graph>.data`` beside the graph (protobuf's limit is 2 GB).
_EXTERNAL_DATA_BYTES = 1_800_000_000

_MS_OPS = frozenset({"GroupQueryAttention", "SkipSimplifiedLayerNormalization", "QuickGelu"})


def _norm(
    node: Any,
    init: Any,
    weights: dict[str, npt.NDArray[np.float32]],
    prefix: str,
    residual: str,
    pending: str | None,
    eps: float,
) -> tuple[str, str]:
    """RMS norm of ``residual + pending``; returns (normed, new residual)."""
    gamma = init(f"{prefix}.weight", weights[f"{prefix}.weight"])
    out = f"/{prefix}/output_0"
    if pending is None:
        node("SimplifiedLayerNormalization", [residual, gamma], [out],
             name=f"/{prefix}/SimplifiedLayerNorm", axis=-1, epsilon=eps)  # fmt: skip
        return out, residual
    summed = f"/{prefix}/residual"
    node("SkipSimplifiedLayerNormalization", [pending, residual, gamma], [out, "", "", summed],
         name=f"/{prefix}/SkipSimplifiedLayerNorm", epsilon=eps)  # fmt: skip
    return out, summed
