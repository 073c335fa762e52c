"""Target ``tiny-llama``: a tiny random Llama with SmolLM2's tokenizer, fp32 with KV cache."""

from __future__ import annotations

import json
import time
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

__all__ = ["NAME", "build_tiny_llama", "key_options"]

NAME = "tiny-llama"
CONFIG = TinyLlamaConfig()


def key_options(options: BuildOptions) -> dict[str, Any]:
    return {"target": NAME, "config": CONFIG.as_key()}


def gguf_tokenizer(ctx: BuildContext, source: LocatedSource) -> Any:
    """The GGUF tokenizer, converted once per run."""
    return ctx.remember(f"tokenizer:{source.spec.sha256}", lambda: load_gguf_tokenizer(source.path))


def build_tiny_llama(
    ctx: BuildContext, source: LocatedSource, build_key: str, timer: StageTimer
) -> dict[str, Any]:
    out = ctx.options.out
    work = ctx.work_dir(NAME)
    remove_tree(work)
    started = time.perf_counter()
    with timer.stage("tokenizer from GGUF"):
        tokenizer = gguf_tokenizer(ctx, source)
    with timer.stage("init random model"):
        model = make_tiny_llama(CONFIG, len(tokenizer))
    with timer.stage("write onnx (fused attention)"):
        onnx_path = write_llama_gqa(model, work / "onnx" / "model.onnx")
    with timer.stage("write artifact"):
        final = out / NAME
        staging = stage_dir(final)
        copy_files(onnx_files(onnx_path.parent), staging)
        save_tokenizer_json(tokenizer, staging / "tokenizer.json")
        (staging / "config.json").write_text(
            json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        graph = graph_io(staging / "model.onnx")
        manifest = ModelManifest(
            schema=1,
            name=NAME,
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
            context_length=CONFIG.max_position_embeddings,
            special_tokens=SMOLLM2_SPECIAL_TOKENS,
            llm=llm_spec(model.config, graph.inputs, graph.outputs),
            embedding=None,
            accuracy=None,
            benchmark=None,
        )
        written = install_dir(staging, final, manifest)
    remove_tree(work)
    return {
        "shipped": "fp32",
        "reason": "test model: fp32 only, no gate",
        "variants": {
            "fp32": {
                "dir": str(final),
                "version": written.version,
                "size_bytes": dir_size(final),
                "size_mb": round(dir_size(final) / 1e6, 1),
            }
        },
    }
