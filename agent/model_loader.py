"""The agent's local model store: artifact directories (manifest.json each) on disk.

Loading checks every file against its manifest (size and sha256) before a session is
created, so a truncated or tampered artifact never serves.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.engine.causal_lm import CausalLM
from agent.engine.continuous_batcher import BatcherConfig, ContinuousBatcher
from agent.engine.embed_batcher import EmbeddingBatchConfig
from agent.engine.embedder import OnnxEmbeddingModel
from agent.engine.interface import EmbeddingModel, TextModel
from agent.engine.memory import heap_in_use, release_mapped_weights
from agent.engine.ort_session import SessionConfig, create_session
from agent.engine.residency import Residency, ResidencyConfig
from agent.engine.step_cores import new_step_executor
from agent.engine.supervisor import RestartPolicy
from agent.engine.text_codec import TextCodec
from agent.engine.text_model import OnnxTextModel
from agent.errors import ModelLoadError
from agent.model_registry import ModelRegistry
from models.errors import ModelsError
from models.manifest import (
    MANIFEST_FILENAME,
    LlmSpec,
    ModelManifest,
    load_manifest,
    verify_files,
)

log = logging.getLogger(__name__)


def find_artifacts(models_dir: Path) -> dict[str, Path]:
    """Served name -> artifact directory, for every manifest directly under ``models_dir``."""
    found: dict[str, Path] = {}
    if not models_dir.is_dir():
        return found
    for manifest_path in sorted(models_dir.glob(f"*/{MANIFEST_FILENAME}")):
        found[manifest_path.parent.name] = manifest_path.parent
    return found


def read_manifest(directory: Path, *, verify: bool) -> ModelManifest:
    try:
        manifest = load_manifest(directory / MANIFEST_FILENAME)
        if verify:
            verify_files(manifest, directory)
    except ModelsError as exc:
        raise ModelLoadError(f"artifact {directory} is unusable: {exc}") from exc
    return manifest


def causal_lm_spec(directory: Path, manifest: ModelManifest) -> LlmSpec:
    """The decoder graph's shapes and tensor names, from its manifest."""
    if manifest.llm is None:
        raise ModelLoadError(f"{directory}: text-generation manifest without an 'llm' section")
    return manifest.llm


def load_text_model(
    directory: Path,
    manifest: ModelManifest,
    session_config: SessionConfig,
    max_context_tokens: int,
    batcher_config: BatcherConfig,
    restart_policy: RestartPolicy | None = None,
    *,
    lazy: bool = False,
    step_executor: ThreadPoolExecutor | None = None,
) -> OnnxTextModel:
    """The model's light part (tokenizer, chat template, grammar compiler) and a way to
    build its heavy part (session and engine): built now, or on demand when ``lazy``."""
    spec = causal_lm_spec(directory, manifest)
    special = manifest.special_tokens
    codec = TextCodec(
        directory / manifest.tokenizer.file,
        chat_template=manifest.chat_template,
        add_special_tokens=manifest.tokenizer.add_special_tokens,
        bos_token=special.bos_token or "",
        eos_token=special.eos_token or "",
    )

    def build_engine(warm: bool = True) -> ContinuousBatcher:
        # loaded by the residency: it trims the heap once the model serves
        session = create_session(directory / manifest.graph.onnx, session_config, trim=not lazy)
        lm = CausalLM(session, spec)
        if lazy and warm:
            # loaded by the residency beside a serving model: the first token on the
            # loader's thread (which yields the cores), not as a step on the step thread
            # every model shares, ahead of the serving models' steps (Qwen2.5-Coder's
            # first step: 50-100 ms of a loaded SmolLM2's TTFT)
            lm.warm_up()
        engine = ContinuousBatcher(
            lm,
            codec,
            special.eos_token_ids,
            batcher_config,
            restart_policy,
            release_idle=functools.partial(release_mapped_weights, directory / manifest.graph.onnx),
            executor=step_executor,
        )
        _log_kv_budget(manifest, spec, lm.kv_bytes_per_token, batcher_config, engine)
        return engine

    engine: ContinuousBatcher | None = None
    measured: int | None = None
    if not lazy:  # built now (at start, or by a rollout): its footprint measured as a load's
        before = heap_in_use()
        engine = build_engine()
        after = heap_in_use()
        measured = None if before is None or after is None else after - before
    kv_bytes = batcher_config.kv_cache_bytes
    if batcher_config.kv_budget_tokens is not None:  # the deprecated budget, converted
        per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4
        kv_bytes = batcher_config.kv_budget_tokens * per_token
    return OnnxTextModel(
        model_id=manifest.name,
        version=manifest.version,
        context_length=min(manifest.context_length, max_context_tokens),
        codec=codec,
        engine=engine,
        eos_token_ids=special.eos_token_ids,
        build_engine=build_engine,
        predicted_bytes=graph_bytes(directory, manifest),
        reserve_bytes=kv_bytes + batcher_config.prefix_cache_bytes,
        measured_bytes=measured,
    )


def graph_bytes(directory: Path, manifest: ModelManifest) -> int:
    """Bytes of the model's graph and its external data: its weights' footprint before a
    load has measured it (an overestimate where weights stay mapped and unread)."""
    graph = directory / manifest.graph.onnx
    total = 0
    for path in graph.parent.iterdir():
        if path.name == graph.name or path.name.startswith(graph.name + "."):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
    return total


def _log_kv_budget(
    manifest: ModelManifest,
    spec: LlmSpec,
    per_token: int,
    batcher_config: BatcherConfig,
    engine: ContinuousBatcher,
) -> None:
    if batcher_config.kv_budget_tokens is not None:
        log.warning(
            "engine.kv_budget_tokens is deprecated: set engine.kv_cache_bytes instead; "
            "for %s, %d tokens x %d bytes a token (its layers x kv heads x head dim x 2 x "
            "%d-byte values), with the copy made while the cache grows, is "
            "engine.kv_cache_bytes = %d",
            manifest.name,
            batcher_config.kv_budget_tokens,
            per_token,
            per_token // (2 * spec.num_layers * spec.num_kv_heads * spec.head_dim),
            engine.kv_cache_bytes,
        )
    log.info(
        "model %s: key/value cache up to %.0f MiB, %d bytes a token: %d tokens admitted at once",
        manifest.name,
        engine.kv_cache_bytes / 2**20,
        per_token,
        engine.kv_budget_tokens,
    )


def load_embedding_model(
    directory: Path,
    manifest: ModelManifest,
    session_config: SessionConfig,
    batch_config: EmbeddingBatchConfig,
    restart_policy: RestartPolicy | None = None,
) -> EmbeddingModel:
    if manifest.embedding is None:
        raise ModelLoadError(f"{directory}: feature-extraction manifest without 'embedding'")
    emb = manifest.embedding
    if emb.pooling != "mean":
        raise ModelLoadError(f"{directory}: pooling {emb.pooling!r} is not supported (mean)")
    return OnnxEmbeddingModel(
        model_id=manifest.name,
        version=manifest.version,
        session=create_session(
            directory / manifest.graph.onnx, session_config, fp32_where_int8_is_slow=True
        ),
        tokenizer_file=directory / manifest.tokenizer.file,
        max_input_tokens=emb.max_length,
        normalize=emb.normalize,
        pad_token_id=manifest.special_tokens.pad_token_id or 0,
        batch_config=batch_config,
        restart_policy=restart_policy,
    )


def load_registry(
    models_dir: Path,
    serve: Sequence[str],
    *,
    session_config: SessionConfig,
    max_context_tokens: int,
    batcher_config: BatcherConfig | None = None,
    embedding_batch_config: EmbeddingBatchConfig | None = None,
    restart_policy: RestartPolicy | None = None,
    verify: bool = True,
    residency: ResidencyConfig | None = None,
) -> ModelRegistry:
    """Load the named artifacts (all found when ``serve`` is empty) into a registry.

    The engines are not running yet: the owner calls ``await registry.start()`` and, when
    done, ``await registry.close()``. With ``residency``, text models' weights are loaded
    by the registry's :class:`Residency`: at start the pinned ones and then, in order, those
    that fit the budget; the rest when a request needs them. Their steps share one thread.
    """
    managed = Residency(residency) if residency is not None else None
    step_executor = new_step_executor() if managed else None
    available = find_artifacts(models_dir)
    names = list(serve) or sorted(available)
    if not names:
        raise ModelLoadError(
            f"no model artifacts under {models_dir}; build them with `python -m models build`"
        )
    text: dict[str, TextModel] = {}
    embedding: dict[str, EmbeddingModel] = {}
    for name in names:
        directory = available.get(name)
        if directory is None:
            raise ModelLoadError(
                f"model {name!r} not found under {models_dir} "
                f"(found: {', '.join(sorted(available)) or 'none'})"
            )
        started = time.perf_counter()
        manifest = read_manifest(directory, verify=verify)
        if manifest.task == "text-generation":
            text[manifest.name] = load_text_model(
                directory,
                manifest,
                session_config,
                max_context_tokens,
                batcher_config or BatcherConfig(),
                restart_policy,
                lazy=managed is not None,
                step_executor=step_executor,
            )
        else:
            embedding[manifest.name] = load_embedding_model(
                directory,
                manifest,
                session_config,
                embedding_batch_config or EmbeddingBatchConfig(),
                restart_policy,
            )
        log.info(
            "model %s version %s ready in %.1f s%s",
            manifest.name,
            manifest.version,
            time.perf_counter() - started,
            " (its weights load on demand)" if managed and manifest.name in text else "",
        )
    return ModelRegistry(text, embedding, residency=managed, step_executor=step_executor)
