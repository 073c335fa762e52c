"""The models one agent serves, looked up by the id clients send (``name`` or
``name@version``).

Hot swap: :meth:`ModelRegistry.swap` puts a new version of a model in place; requests
looked up after it get the new one, those already running finish on the old one, which
the caller closes once :meth:`drained` says it is idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from agent.engine.interface import EmbeddingModel, EngineLoad, TextModel
from agent.engine.residency import Residency
from agent.engine.text_model import OnnxTextModel
from agent.errors import InvalidRequestError, ModelNotFoundError

log = logging.getLogger(__name__)


class ModelRegistry:
    def __init__(
        self,
        text_models: Mapping[str, TextModel],
        embedding_models: Mapping[str, EmbeddingModel],
        *,
        residency: Residency | None = None,
        step_executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.text_models = dict(text_models)
        self.embedding_models = dict(embedding_models)
        # which text models hold their weights (None: all of them, always)
        self.residency = residency
        self._step_executor = step_executor
        for model in self.text_models.values():
            self._manage(model)

    @property
    def step_executor(self) -> ThreadPoolExecutor | None:
        """The one thread every text model's steps run on (None: each its own)."""
        return self._step_executor

    def _manage(self, model: TextModel) -> None:
        if self.residency is None or not isinstance(model, OnnxTextModel):
            return
        model.residency = self.residency
        self.residency.register(
            model,
            predicted_bytes=model.predicted_bytes,
            reserve_bytes=model.reserve_bytes,
            loaded=model.loaded,
            measured_bytes=model.measured_bytes,
        )

    @property
    def ids(self) -> list[str]:
        return sorted([*self.text_models, *self.embedding_models])

    @staticmethod
    def split(model_id: str) -> tuple[str, str | None]:
        """``name@version`` -> (name, version); a bare name -> (name, None)."""
        name, at, version = model_id.partition("@")
        return name, (version if at else None)

    def _pinned(self, model: TextModel | EmbeddingModel, name: str, version: str) -> None:
        if model.version != version:
            raise ModelNotFoundError(
                f"The model '{name}' is served here in version {model.version}, not {version}",
                param="model",
            )

    def swap_text(self, model: TextModel) -> TextModel | None:
        """Serve ``model`` (started) for its name from now on; returns the old one."""
        old = self.text_models.get(model.model_id)
        self.text_models = {**self.text_models, model.model_id: model}
        self._manage(model)
        return old

    def withdraw(self, model_id: str) -> TextModel | EmbeddingModel | None:
        """Stop serving ``model_id`` (its target says store only); returns the model, for
        its caller to close once its requests are done (None: not served here)."""
        text = self.text_models.get(model_id)
        if text is not None:
            self.text_models = {k: v for k, v in self.text_models.items() if k != model_id}
            if self.residency is not None:
                self.residency.unregister(model_id)
            return text
        emb = self.embedding_models.get(model_id)
        if emb is not None:
            self.embedding_models = {
                k: v for k, v in self.embedding_models.items() if k != model_id
            }
        return emb

    def swap_embedding(self, model: EmbeddingModel) -> EmbeddingModel | None:
        old = self.embedding_models.get(model.model_id)
        self.embedding_models = {**self.embedding_models, model.model_id: model}
        return old

    def _not_found(self, model_id: str) -> ModelNotFoundError:
        served = ", ".join(self.ids) or "none"
        return ModelNotFoundError(
            f"The model '{model_id}' does not exist on this agent (served: {served})",
            param="model",
        )

    def text_model(self, model_id: str) -> TextModel:
        model_id, version = self.split(model_id)
        model = self.text_models.get(model_id)
        if model is not None:
            if version is not None:
                self._pinned(model, model_id, version)
            return model
        if model_id in self.embedding_models:
            raise InvalidRequestError(
                f"'{model_id}' is an embedding model; use /v1/embeddings", param="model"
            )
        raise self._not_found(model_id)

    def embedding_model(self, model_id: str) -> EmbeddingModel:
        model_id, version = self.split(model_id)
        model = self.embedding_models.get(model_id)
        if model is not None:
            if version is not None:
                self._pinned(model, model_id, version)
            return model
        if model_id in self.text_models:
            raise InvalidRequestError(
                f"'{model_id}' is a text-generation model, not an embedding model",
                param="model",
            )
        raise self._not_found(model_id)

    def load(self) -> EngineLoad:
        """The load of every text engine, added up."""
        loads = [m.load() for m in self.text_models.values()]
        used = sum(x.kv_used_tokens for x in loads)
        return EngineLoad(
            running=sum(x.running for x in loads),
            waiting=sum(x.waiting for x in loads),
            kv_used_tokens=used,
            kv_used_fraction=max((x.kv_used_fraction for x in loads), default=0.0),
            kv_allocated_bytes=sum(x.kv_allocated_bytes for x in loads),
            prefix_cache_bytes=sum(x.prefix_cache_bytes for x in loads),
        )

    async def start(self, on_dead: Callable[[str], None] | None = None) -> None:
        """Starts every model's engine loop. ``on_dead`` hears, once per model, that its
        engine failed past its restart policy (the reason names the model)."""

        def tell(model_id: str) -> Callable[[str], None] | None:
            if on_dead is None:
                return None
            return lambda reason: on_dead(f"model {model_id}: {reason}")

        for text in self.text_models.values():
            await text.start(tell(text.model_id))
        for emb in self.embedding_models.values():
            await emb.start(tell(emb.model_id))
        if self.residency is not None:
            await self._load_at_start(self.residency)
            await self.residency.start()

    async def _load_at_start(self, residency: Residency) -> None:
        """The pinned models (a failure is fatal, as for any model served at start), then
        each other model in order while it fits the budget without unloading another."""
        pinned = [m for m in self.text_models if m in residency.config.pinned]
        for name in pinned:
            await residency.load(name, "pinned")
        for name in self.text_models:
            if name in pinned or not residency.fits_now(name):
                continue
            await residency.load(name, "start")
        cold = [m for m in self.text_models if residency.state(m) != "loaded"]
        if cold:
            log.info("not loaded at start (they load on their first request): %s",
                     ", ".join(cold))  # fmt: skip

    async def close(self) -> None:
        if self.residency is not None:
            await self.residency.close()
        for text in self.text_models.values():
            await text.close()
        for emb in self.embedding_models.values():
            await emb.close()
        if self._step_executor is not None:
            await asyncio.to_thread(self._step_executor.shutdown, wait=True)


def served_name(model: TextModel | EmbeddingModel) -> str:
    """What replies name as their ``model``: ``name@version``."""
    return f"{model.model_id}@{model.version}" if model.version else model.model_id
