"""``/v1/embeddings``: one normalised vector per input, as floats or base64."""

from __future__ import annotations

import base64

import numpy as np

from agent.api.protocol import EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from agent.errors import UnsupportedError
from agent.model_registry import ModelRegistry, served_name


class EmbeddingService:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    async def create(self, req: EmbeddingRequest) -> EmbeddingResponse:
        model = self._registry.embedding_model(req.model)
        raw = req.input
        inputs: list[str | list[int]]
        if isinstance(raw, str):
            inputs = [raw]
        elif all(isinstance(t, int) for t in raw):
            inputs = [[int(t) for t in raw]]  # type: ignore[arg-type]
        else:
            inputs = list(raw)  # type: ignore[arg-type]
        result = await model.embed(inputs)
        dim = len(result.vectors[0])
        if req.dimensions is not None and req.dimensions != dim:
            raise UnsupportedError(
                f"this model returns {dim} dimensions; dimensions={req.dimensions} is not "
                "supported",
                param="dimensions",
            )
        data = []
        for i, vector in enumerate(result.vectors):
            embedding: list[float] | str = vector
            if req.encoding_format == "base64":
                packed = np.asarray(vector, dtype="<f4").tobytes()
                embedding = base64.b64encode(packed).decode("ascii")
            data.append(EmbeddingData(index=i, embedding=embedding))
        return EmbeddingResponse(
            data=data,
            model=served_name(model),
            usage=EmbeddingUsage(
                prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens
            ),
        )
