"""Building the agent's model sync from its configuration."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from agent.config import AgentConfig
from agent.engine.interface import EmbeddingModel, TextModel
from agent.enrolled_tls import EnrolledClientContext
from agent.enrollment import state_dir_of
from agent.https import enrollment_cert_files
from agent.model_loader import load_embedding_model, load_text_model
from agent.model_registry import ModelRegistry
from agent.sync.fetch import BlobFetcher
from agent.sync.manager import ModelSync, SyncOptions
from agent.sync.store import ModelStore
from agent.sync.trust import TrustedKeys
from models.manifest import ModelManifest


def models_source(config: AgentConfig) -> str:
    """ "dir" or "store" (``models.source``, with "auto" resolved)."""
    m = config.models
    if m.source != "auto":
        return m.source
    if (config.coordinator.target or m.seed_dir) and "dir" not in m.model_fields_set:
        return "store"
    return "dir"


def sync_wanted(config: AgentConfig) -> bool:
    """Model sync runs with a coordinator, with a store source or an explicit store dir."""
    m = config.models
    return (
        bool(config.coordinator.target)
        or models_source(config) == "store"
        or bool(m.store_dir)
        or bool(m.seed_dir)
    )


def store_dir(config: AgentConfig) -> Path:
    if config.models.store_dir:
        return Path(config.models.store_dir).expanduser()
    return state_dir_of(config) / "models"


def fleet_ssl_context(config: AgentConfig) -> ssl.SSLContext | None:
    """Trust the fleet CA and present this agent's certificate (for https blob sources)."""
    files = enrollment_cert_files(state_dir_of(config))
    ca = state_dir_of(config) / "ca.pem"
    if not ca.is_file():
        return None
    context = ssl.create_default_context(cafile=str(ca))
    if files.cert.is_file() and files.key.is_file():
        context.load_cert_chain(str(files.cert), str(files.key))
    return context


def fleet_blob_tls(config: AgentConfig) -> EnrolledClientContext:
    """:func:`fleet_ssl_context` as each download starts, made again when enrollment (in
    the first session, for an agent serving plain HTTP) or a renewal wrote its files."""
    files = enrollment_cert_files(state_dir_of(config))
    ca = state_dir_of(config) / "ca.pem"
    return EnrolledClientContext(lambda: fleet_ssl_context(config), [ca, files.cert, files.key])


def build_model_sync(
    config: AgentConfig,
    registry: ModelRegistry,
    listeners: list[object],
    *,
    on_loaded: Callable[[Path, ModelManifest], None] | None = None,
) -> ModelSync:
    """``on_loaded(directory, manifest)`` runs in the loading thread after an embedding
    model is built from its artifact (the moderation heads it brought load there)."""
    m, engine = config.models, config.engine
    store = ModelStore(
        store_dir(config),
        keep_versions=m.keep_versions,
        max_bytes=m.max_store_bytes,
        seed=Path(m.seed_dir).expanduser() if m.seed_dir else None,
    )
    store.adopt_seed()
    trust = TrustedKeys(
        state_dir_of(config) if config.coordinator.target else None,
        m.trusted_keys,
        [Path(m.trusted_keys_file).expanduser()] if m.trusted_keys_file else [],
        allow_unsigned=m.allow_unsigned,
    )
    fetcher = BlobFetcher(
        store,
        concurrency=m.download_concurrency,
        bandwidth_bytes_per_s=m.download_bytes_per_s,
        timeout_s=m.download_timeout_s,
        peer_wait_s=m.peer_wait_s,
        ssl=fleet_blob_tls(config) if config.coordinator.target else None,
    )

    def load(directory: Path, manifest: ModelManifest) -> TextModel | EmbeddingModel:
        if manifest.task == "text-generation":
            model = load_text_model(
                directory,
                manifest,
                engine.session(),
                engine.max_context_tokens,
                engine.batcher(),
                step_executor=registry.step_executor,
            )
            for listener in listeners:
                model.add_listener(listener)  # type: ignore[arg-type]
            return model
        embedding = load_embedding_model(
            directory, manifest, engine.session(), config.embeddings.batch()
        )
        if on_loaded is not None:
            on_loaded(directory, manifest)
        return embedding

    options = SyncOptions(
        self_check=m.self_check,
        self_check_threads=m.self_check_threads,
        self_check_prompts=m.self_check_prompts,
        load_memory_factor=m.load_memory_factor,
        drain_timeout_s=m.drain_timeout_s,
        verify_on_cold_start=m.verify_checksums,
    )
    return ModelSync(store, fetcher, trust, registry, load, options)
