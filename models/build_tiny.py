"""Target ``tiny-llama``: a tiny random Llama with SmolLM2's tokenizer, fp32 with KV cache.

Two variants, both fp32 with the same tokenizer, chat template and graph interface:

- ``fp32`` (shipped, ``tiny-llama/``): the tiny shape, for fast engine tests;
- ``deep`` (``_variants/tiny-llama-deep/``): a bigger random network of its own seed,
  several times slower to first token on the same prompts, so a rollout from the tiny
  model to it is a real slower version of ``tiny-llama`` (the rollout TTFT gate's
  end-to-end test).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from models.artifact import copy_files, dir_size, graph_io, install_dir, onnx_files, stage_dir
from models.context import BuildContext, BuildOptions, StageTimer, utc_now
from models.export_llm import (
    SMOLLM2_SPECIAL_TOKENS,
    load_gguf_tokenizer,
    remove_tree,
    save_tokenizer_json,
)
from models.llama_graph import llm_spec, write_llama_gqa
from models.manifest import ModelManifest, QuantizationSpec, TokenizerSpec
from models.sources import LocatedSource
from models.tiny import TinyLlamaConfig, make_tiny_llama

__all__ = ["CONFIG", "DEEP", "NAME", "build_tiny_llama", "key_options"]

NAME = "tiny-llama"
CONFIG = TinyLlamaConfig()
#: The ``deep`` variant's shape: 16 times the tiny model's layers and 8 times its MLP width
#: (13.0M parameters, 6.7M of them in the layers against 0.07M; 56 MB on disk against 29 MB,
#: most of both the vocabulary's embedding and LM head). Chosen by
#: measurement as the smallest file that is several times slower to first token on the
#: rollout test's prompts (~170 tokens): with one ORT thread a prefill takes 45 ms against
#: 1.3 ms; in the end-to-end rollout on a loaded 2-core box, TTFT p99 7-8x the tiny
#: model's and p50 about 11x. Half the MLP width (43 MB) measured only 2.7x at p99; width
#: 128 with 12 layers (94 MB) no slower than this. A head size of 16 (64 / 4 heads) is
#: GroupQueryAttention's smallest.
DEEP = TinyLlamaConfig(
    hidden_size=64,
    num_hidden_layers=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=1024,
    seed=1,
)


def key_options(options: BuildOptions) -> dict[str, Any]:
    return {"target": NAME, "config": CONFIG.as_key(), "deep": DEEP.as_key()}


def gguf_tokenizer(ctx: BuildContext, source: LocatedSource) -> Any:
    """The GGUF tokenizer, converted once per run."""
    return ctx.remember(f"tokenizer:{source.spec.sha256}", lambda: load_gguf_tokenizer(source.path))


def build_tiny_llama(
    ctx: BuildContext, source: LocatedSource, build_key: str, timer: StageTimer
) -> dict[str, Any]:
    from models.build import variant_dir

    out = ctx.options.out
    started = time.perf_counter()
    with timer.stage("tokenizer from GGUF"):
        tokenizer = gguf_tokenizer(ctx, source)
    variants: dict[str, Any] = {}
    for variant, config, final in (
        ("fp32", CONFIG, out / NAME),
        ("deep", DEEP, variant_dir(out, NAME, "deep")),
    ):
        work = ctx.work_dir(f"{NAME}-{variant}")
        remove_tree(work)
        with timer.stage(f"{variant}: init random model"):
            model = make_tiny_llama(config, len(tokenizer))
        with timer.stage(f"{variant}: write onnx (fused attention)"):
            onnx_path = write_llama_gqa(model, work / "onnx" / "model.onnx")
        with timer.stage(f"{variant}: write artifact"):
            written = _write_artifact(
                onnx_path, final, model, tokenizer, config, source, build_key, started
            )
        remove_tree(work)
        variants[variant] = {
            "dir": str(final),
            "version": written.version,
            "shape": config.as_key(),
            "size_bytes": dir_size(final),
            "size_mb": round(dir_size(final) / 1e6, 1),
        }
    return {
        "shipped": "fp32",
        "reason": "test model: fp32 only, no gate; deep: the same interface, slower",
        "variants": variants,
    }


def _write_artifact(
    onnx_path: Path,
    final: Path,
    model: Any,
    tokenizer: Any,
    config: TinyLlamaConfig,
    source: LocatedSource,
    build_key: str,
    started: float,
) -> ModelManifest:
    staging = stage_dir(final)
    copy_files(onnx_files(onnx_path.parent), staging)
    save_tokenizer_json(tokenizer, staging / "tokenizer.json")
    (staging / "config.json").write_text(
        json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    graph = graph_io(staging / "model.onnx")
    manifest = ModelManifest(
        schema=1,
        # the shipped directory serves as tiny-llama; a variant is named as its directory
        name=final.name,
        version="fp32-000000000000",  # filled in by install_dir
        task="text-generation",
        variant="fp32",
        build_key=build_key,
        built_at=utc_now(),
        build_seconds=round(time.perf_counter() - started, 2),
        source=source.spec,
        quantization=QuantizationSpec(method="none", bits=32, block_size=None),
        files=(),
        graph=graph,
        tokenizer=TokenizerSpec(file="tokenizer.json", add_special_tokens=False),
        chat_template=tokenizer.chat_template,
        context_length=config.max_position_embeddings,
        special_tokens=SMOLLM2_SPECIAL_TOKENS,
        llm=llm_spec(model.config, graph.inputs, graph.outputs),
        embedding=None,
        accuracy=None,
        benchmark=None,
    )
    return install_dir(staging, final, manifest)
