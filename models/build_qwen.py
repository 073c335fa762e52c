"""Target ``qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-0.5B-Instruct, int4 or int8.

The source is a Q4_K_M GGUF assembled from six wheels (:func:`models.sources.locate_qwen_gguf`);
transformers de-quantizes it to float32 (about 80 s on 2 cores) and that model is the
reference: its fp32 graph is written to the build's scratch directory, evaluated by the
accuracy gate and deleted (2.5 GB: nothing serves it, so it is never an artifact). Two
quantized variants are built from it:

- ``int4``: 4-bit MatMulNBits (block 32, int8 activations) for the layer MatMuls whose
  GGUF tensors have fewer than 6 bits (Q5_0, Q4_K), symmetric or asymmetric by measured
  perplexity; weight-only 8-bit for the LM head (as SmolLM2's) and for the MatMuls that
  hold a Q8_0 or Q6_K tensor (``attn_v`` and ``ffn_down`` in 12 of the 24 layers: what
  llama.cpp's Q4_K_M keeps at more bits). The GGUF's layers are mostly Q5_0 (5 bits per
  weight, one scale per 32): 4 bits round them again, and the gate measures what that costs.
  Measured: perplexity 1.121x fp32 with every layer MatMul at 4 bits, 1.064x with those 24
  at 8 bits (+31 MB; the shipped manifest's ``perplexity_ratio``);
- ``int8``: weight-only 8-bit MatMulNBits (block 32) for every MatMul, head included.

Both then get the post-pass every shipped decoder gets (:func:`models.quantize.finish_llm_graph`):
the token embedding stored 8-bit (the GGUF's Q5_0 table, reproduced exactly) and the weights
as external data that ONNX Runtime memory-maps. The shipped directory holds
the variant with the fewest weight bits that passed the gate; the other goes to
``_variants/qwen2.5-coder-0.5b-instruct-<variant>/``. When neither passes the build fails:
shipping the 2.5 GB reference is no answer for an edge box.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from models.artifact import copy_files, dir_size, graph_io, install_dir, onnx_files, stage_dir
from models.bench import decode_benchmark
from models.context import BuildContext, BuildOptions, StageTimer, utc_now
from models.errors import ConversionError
from models.export_llm import (
    load_gguf_model_untied,
    load_gguf_tokenizer,
    remove_tree,
    save_tokenizer_json,
)
from models.gate import LlmEval, LlmGateData, evaluate_llm, llm_gate, render_chat
from models.llama_graph import llm_spec, write_llama_gqa
from models.manifest import (
    LlmSpec,
    ModelManifest,
    QuantizationSpec,
    SpecialTokens,
    TokenizerSpec,
)
from models.ort_llm import OrtDecoder
from models.quantize import finish_llm_graph, output_matmul, quantize_nbits
from models.sources import LocatedSource

__all__ = ["NAME", "QWEN_SPECIAL_TOKENS", "build_qwen", "key_options"]

log = logging.getLogger(__name__)

NAME: Final = "qwen2.5-coder-0.5b-instruct"
BLOCK: Final = 32
INT4_ACCURACY_LEVEL: Final = 4
BENCH_TOKENS: Final = 64
BENCH_PROMPT: Final = "Write a short story about a lighthouse keeper who lives alone by the sea."
SHIP_RULE: Final = "fewest weight bits that passed the gate; fp32 never shipped"

# ChatML: a turn ends with <|im_end|>; a bare completion ends with <|endoftext|>, which is
# also the padding (the GGUF's padding_token_id). Qwen adds no BOS.
QWEN_SPECIAL_TOKENS: Final = SpecialTokens(
    bos_token_id=None,
    eos_token_ids=(151645, 151643),
    pad_token_id=151643,
    bos_token=None,
    eos_token="<|im_end|>",
)


def key_options(options: BuildOptions) -> dict[str, Any]:
    return {
        "target": NAME,
        "skip_gate": options.skip_gate,
        "int4": {
            "block_size": BLOCK,
            "accuracy_level": INT4_ACCURACY_LEVEL,
            "lm_head": "matmul-nbits-8",
            "symmetric": "by perplexity",
            "8-bit": "MatMuls holding Q8_0/Q6_K GGUF tensors",
        },
        "int8": {"method": "matmul-nbits-8", "block_size": BLOCK, "accuracy_level": 4},
        "token_embedding": "gather-block-quantized-8",
        "external_data": {"tensor_alignment": 4096},
        "bench_tokens": BENCH_TOKENS,
        "ship": SHIP_RULE,
    }


@dataclass
class Variant:
    """One graph of the target while it is being built."""

    name: str  # "fp32" (the reference, never shipped), "int8" or "int4"
    onnx: Path  # work copy of model.onnx
    quantization: dict[str, Any]
    benchmark: dict[str, Any] | None = None
    evaluation: LlmEval | None = None
    accuracy: dict[str, Any] | None = None


def build_qwen(
    ctx: BuildContext, source: LocatedSource, build_key: str, timer: StageTimer
) -> dict[str, Any]:
    opts = ctx.options
    work = ctx.work_dir(NAME)
    remove_tree(work)
    work.mkdir(parents=True)
    started = time.perf_counter()

    with timer.stage("tokenizer from GGUF"):
        tokenizer = load_gguf_tokenizer(source.path)
        tokenizer_json = work / "tokenizer.json"
        save_tokenizer_json(tokenizer, tokenizer_json)
        chat_template: str = tokenizer.chat_template
        _check_special_tokens(tokenizer)
        del tokenizer
    with timer.stage("load GGUF into torch (de-quantized to fp32)"):
        model = load_gguf_model_untied(source.path)
        config = model.config
        _check_config(model)
    with timer.stage("write fp32 onnx (fused attention; the reference, not shipped)"):
        fp32_path = write_llama_gqa(model, work / "fp32" / "model.onnx")
        del model
    graph = graph_io(fp32_path)
    spec = llm_spec(config, graph.inputs, graph.outputs)
    data = LlmGateData.load()
    ids = _encode(tokenizer_json, data.text)
    variants: dict[str, Variant] = {
        "fp32": Variant("fp32", fp32_path, {"method": "none", "bits": 32, "block_size": None})
    }
    with timer.stage("quantize int8 (MatMulNBits 8-bit, weight-only)"):
        int8_path = work / "int8" / "model.onnx"
        details = quantize_nbits(
            fp32_path, int8_path, bits=8, block_size=BLOCK, symmetric=True,
            quantize_gather=False, accuracy_level=4,
        )  # fmt: skip
        variants["int8"] = Variant(
            "int8", int8_path, {**details, **finish_llm_graph(int8_path, int8_path)}
        )
    with timer.stage("quantize int4 (MatMulNBits, symmetric and asymmetric)"):
        keep_8bit = _matmuls_over_5_bits(source.path)
        variants["int4"] = _int4_by_perplexity(work, fp32_path, spec, ids, opts, keep_8bit)

    prompt_ids = _encode(tokenizer_json, render_chat(chat_template, BENCH_PROMPT))
    reference: LlmEval | None = None
    for variant in variants.values():
        decoder = OrtDecoder(variant.onnx, spec, opts.threads)
        with timer.stage(f"benchmark {variant.name} ({BENCH_TOKENS} new tokens, batch 1)"):
            variant.benchmark = decode_benchmark(decoder, prompt_ids, BENCH_TOKENS)
        if opts.skip_gate:
            continue
        with timer.stage(f"accuracy gate {variant.name}"):
            variant.evaluation = evaluate_llm(
                decoder, tokenizer_json, chat_template, QWEN_SPECIAL_TOKENS.eos_token_ids, data
            )
        if reference is None:
            reference = variant.evaluation
            variant.accuracy = {**reference.as_json(), "reference": True, "passed": True}
        else:
            variant.accuracy = llm_gate(reference, variant.evaluation)
            log.info(
                "%s: perplexity %.3f (x%.3f), factual %d/%d -> %s",
                variant.name,
                variant.evaluation.perplexity,
                variant.accuracy["perplexity_ratio"],
                variant.evaluation.factual_correct,
                variant.evaluation.factual_total,
                "PASS" if variant.accuracy["passed"] else "FAIL",
            )
        del decoder

    shipped, reason = choose(variants, opts.skip_gate)
    print(_table(variants, shipped), flush=True)
    report: dict[str, Any] = {"fp32_reference": _report(variants["fp32"], None)}
    report_variants: dict[str, Any] = {}
    with timer.stage("write artifacts"):
        remove_tree(fp32_path.parent)  # 2.5 GB: measured, never shipped
        for name in ("int8", "int4"):
            variant = variants[name]
            final = opts.out / NAME if name == shipped else _variant_dir(opts.out, name)
            manifest = _write(
                variant,
                final,
                name=NAME if name == shipped else final.name,
                build_key=build_key,
                source=source,
                spec=spec,
                config=config,
                tokenizer_json=tokenizer_json,
                chat_template=chat_template,
                build_seconds=time.perf_counter() - started,
            )
            report_variants[name] = _report(variant, final, manifest.version)
        stale = _variant_dir(opts.out, shipped)
        if stale.exists():
            shutil.rmtree(stale)
    remove_tree(work)
    return {"shipped": shipped, "reason": reason, "variants": report_variants, **report}


def choose(variants: dict[str, Variant], skip_gate: bool) -> tuple[str, str]:
    """The quantized variant with the fewest weight bits that passed the gate (speeds
    recorded, never compared); without the gate, the fewest bits unchecked."""
    if skip_gate:
        return "int4", "gate skipped (--skip-gate): fewest weight bits, unchecked"
    passing = [n for n in ("int4", "int8") if (variants[n].accuracy or {}).get("passed")]
    if not passing:
        raise ConversionError(
            f"{NAME}: neither int4 nor int8 passed the accuracy gate "
            f"({ {n: variants[n].accuracy for n in ('int4', 'int8')} }); the fp32 reference "
            "(2.5 GB) is not shipped"
        )
    failed = sorted({"int4", "int8"} - set(passing))
    return passing[0], (
        f"fewest weight bits of {passing} (passed the gate; speeds recorded, not compared); "
        f"{', '.join(failed) if failed else 'none'} failed the gate"
    )


def _check_special_tokens(tokenizer: Any) -> None:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    if (ids["<|im_end|>"], ids["<|endoftext|>"]) != QWEN_SPECIAL_TOKENS.eos_token_ids:
        raise ConversionError(f"{NAME}: unexpected special token ids {ids}")
    if "<|im_start|>" not in (tokenizer.chat_template or ""):
        raise ConversionError(f"{NAME}: the GGUF's chat template is not ChatML")


def _check_config(model: Any) -> None:
    """What the GGUF must have given: qwen2, q/k/v biases, its RoPE base, an untied head."""
    config = model.config
    state = model.state_dict()
    head = state["lm_head.weight"]
    embedding = state["model.embed_tokens.weight"]
    found = {
        "model_type": config.model_type,
        "rope_theta": float(config.rope_theta),
        "q_bias": "model.layers.0.self_attn.q_proj.bias" in state,
        "head_is_embedding": bool(head.shape == embedding.shape and (head == embedding).all()),
    }
    log.info("[%s] loaded: %s", NAME, found)
    if found["model_type"] != "qwen2" or not found["q_bias"] or found["rope_theta"] != 1e6:
        raise ConversionError(f"{NAME}: the GGUF did not load as Qwen2.5 ({found})")
    if found["head_is_embedding"]:
        raise ConversionError(f"{NAME}: expected the GGUF's own output tensor as the head")


def _variant_dir(out: Path, variant: str) -> Path:
    return out / "_variants" / f"{NAME}-{variant}"


def _encode(tokenizer_json: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    ids: list[int] = (
        Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids
    )
    return ids


# GGUF tensor name (after ``blk.N.``) -> the graph's MatMul holding it
_GGUF_TO_MATMUL: Final = {
    "attn_q": "attn/qkv_proj", "attn_k": "attn/qkv_proj", "attn_v": "attn/qkv_proj",
    "attn_output": "attn/o_proj", "ffn_gate": "mlp/gate_up_proj", "ffn_up": "mlp/gate_up_proj",
    "ffn_down": "mlp/down_proj",
}  # fmt: skip
_OVER_5_BITS: Final = ("Q8_0", "Q6_K", "F16", "BF16", "F32")


def _matmuls_over_5_bits(gguf_path: Path) -> tuple[str, ...]:
    """The layer MatMuls (node names of :mod:`models.llama_graph`) holding a GGUF tensor
    stored with more than 5 bits per weight: 4 bits would throw away what the file has."""
    from gguf import GGUFReader

    nodes = set()
    for tensor in GGUFReader(str(gguf_path)).tensors:
        parts = tensor.name.split(".")
        if parts[0] != "blk" or parts[-1] != "weight" or parts[2] not in _GGUF_TO_MATMUL:
            continue
        if tensor.tensor_type.name in _OVER_5_BITS:
            nodes.add(f"/model.layers.{parts[1]}/{_GGUF_TO_MATMUL[parts[2]]}/MatMul")
    log.info("[%s] %d layer MatMuls hold tensors over 5 bits: 8-bit", NAME, len(nodes))
    return tuple(sorted(nodes))


def _quantize_int4(
    fp32: Path, dst: Path, *, symmetric: bool, keep_8bit: tuple[str, ...]
) -> dict[str, Any]:
    """4-bit layers except ``keep_8bit``; those and the head weight-only 8-bit; then the
    post-pass (8-bit token embedding, external data)."""
    head = output_matmul(fp32)
    tmp = dst.with_name(dst.stem + ".nbits.onnx")
    details = quantize_nbits(
        fp32, tmp, bits=4, block_size=BLOCK, symmetric=symmetric, quantize_gather=False,
        accuracy_level=INT4_ACCURACY_LEVEL, exclude_nodes=(head, *keep_8bit),
    )  # fmt: skip
    quantize_nbits(
        tmp, dst, bits=8, block_size=BLOCK, symmetric=True, quantize_gather=False,
        accuracy_level=4,
    )  # fmt: skip
    tmp.unlink()
    details["lm_head"] = {"node": head, "method": "matmul-nbits-8bit-accuracy-level-4"}
    details["8bit_matmuls"] = {"reason": "GGUF tensors over 5 bits", "count": len(keep_8bit)}
    return {**details, **finish_llm_graph(dst, dst)}


def _int4_by_perplexity(
    work: Path,
    fp32: Path,
    spec: LlmSpec,
    ids: list[int],
    opts: BuildOptions,
    keep_8bit: tuple[str, ...],
) -> Variant:
    """Quantize symmetric and asymmetric; keep the one with the lower perplexity."""
    measured: dict[str, tuple[float, Path, dict[str, Any]]] = {}
    for symmetric in (True, False):
        label = "sym" if symmetric else "asym"
        path = work / f"int4-{label}" / "model.onnx"
        details = _quantize_int4(fp32, path, symmetric=symmetric, keep_8bit=keep_8bit)
        nll, count = OrtDecoder(path, spec, opts.threads).negative_log_likelihood(ids)
        measured[label] = (math.exp(nll / count), path, details)
        log.info("int4 %s: perplexity %.3f", label, measured[label][0])
    best = min(measured, key=lambda k: measured[k][0])
    _, path, details = measured[best]
    details["symmetric_choice"] = {
        "chosen": best,
        "perplexity": {k: round(v[0], 4) for k, v in measured.items()},
    }
    for label, (_, other, _) in measured.items():
        if label != best:
            remove_tree(other.parent)
    return Variant("int4", path, details)


def _report(variant: Variant, final: Path | None, version: str = "") -> dict[str, Any]:
    evaluation = variant.evaluation
    entry: dict[str, Any] = {
        "quantization": variant.quantization,
        "benchmark": variant.benchmark,
        "accuracy": variant.accuracy,
        "answers": None
        if evaluation is None
        else [
            {"ok": ok, "answer": a}
            for ok, a in zip(evaluation.correct, evaluation.answers, strict=True)
        ],
    }
    if final is None:
        entry["onnx_bytes"] = sum(p.stat().st_size for p in onnx_files(variant.onnx.parent))
        entry["kept"] = False
    else:
        size = dir_size(final)
        entry |= {"dir": str(final), "version": version, "size_bytes": size,
                  "size_mb": round(size / 1e6, 1)}  # fmt: skip
    return entry


def _table(variants: dict[str, Variant], shipped: str) -> str:
    head = (
        f"{'variant':8} {'onnx MB':>8} {'load s':>7} {'tok/s':>7} {'ppl':>8} {'ppl/fp32':>9} "
        f"{'factual':>8} {'gate':>6}"
    )
    lines = [f"accuracy gate and benchmark for {NAME}", head, "-" * len(head)]
    for name, v in variants.items():
        acc = v.accuracy or {}
        size = sum(p.stat().st_size for p in onnx_files(v.onnx.parent)) / 1e6
        bench = v.benchmark or {}
        ppl = acc.get("perplexity", "-")
        ratio = acc.get("perplexity_ratio", 1.0 if acc.get("reference") else "-")
        factual = (
            f"{acc['factual_correct']}/{acc['factual_total']}" if "factual_correct" in acc else "-"
        )
        verdict = (
            "-"
            if not acc
            else "ref"
            if acc.get("reference")
            else "PASS"
            if acc["passed"]
            else "FAIL"
        )
        lines.append(
            f"{name:8} {size:8.1f} {bench.get('session_load_s', 0):7.2f} "
            f"{bench.get('decode_tokens_per_s', 0):7.1f} {ppl:>8} {ratio:>9} {factual:>8} "
            f"{verdict:>6}" + ("   <- shipped" if name == shipped else "")
        )
    return "\n".join(lines)


def _write(
    variant: Variant,
    final: Path,
    *,
    name: str,
    build_key: str,
    source: LocatedSource,
    spec: LlmSpec,
    config: Any,
    tokenizer_json: Path,
    chat_template: str,
    build_seconds: float,
) -> ModelManifest:
    staging = stage_dir(final)
    copy_files(onnx_files(variant.onnx.parent), staging)
    shutil.copy2(tokenizer_json, staging / "tokenizer.json")
    (staging / "config.json").write_text(
        json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8"
    )
    graph = graph_io(staging / "model.onnx")
    q = dict(variant.quantization)
    quantization = QuantizationSpec(
        method=q.pop("method"), bits=q.pop("bits"), block_size=q.pop("block_size"), details=q
    )
    manifest = ModelManifest(
        schema=1,
        name=name,
        version=f"{variant.name}-000000000000",
        task="text-generation",
        variant=variant.name,
        build_key=build_key,
        built_at=utc_now(),
        build_seconds=round(build_seconds, 2),
        source=source.spec,
        quantization=quantization,
        files=(),
        graph=graph,
        tokenizer=TokenizerSpec(file="tokenizer.json", add_special_tokens=False),
        chat_template=chat_template,
        context_length=int(config.max_position_embeddings),
        special_tokens=QWEN_SPECIAL_TOKENS,
        llm=llm_spec(config, graph.inputs, graph.outputs),
        embedding=None,
        accuracy=variant.accuracy,
        benchmark=variant.benchmark,
    )
    if manifest.llm != spec:
        raise ConversionError(f"{variant.name}: graph interface changed during quantization")
    return install_dir(staging, final, manifest)
