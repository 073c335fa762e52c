"""A tiny, randomly initialised Llama decoder for fast tests of the serving engine.

Same architecture family and graph interface as SmolLM2 (GQA, RoPE, KV cache), SmolLM2's
tokenizer and chat template, but 2 layers of width 64: it exports in seconds and produces
deterministic (meaningless) text.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from models._quiet import offline_env, quiet

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TinyLlamaConfig", "make_tiny_llama"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinyLlamaConfig:
    """Shape of the tiny model; part of the build cache key."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    seed: int = 0

    def as_key(self) -> dict[str, Any]:
        return asdict(self)


def make_tiny_llama(config: TinyLlamaConfig, vocab_size: int) -> PreTrainedModel:
    """Create the model after ``torch.manual_seed(seed)`` (in memory; nothing is saved)."""
    offline_env()
    with quiet():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config_cls: Any = LlamaConfig
        model_cls: Any = LlamaForCausalLM

        torch.manual_seed(config.seed)
        hf_config = config_cls(
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            intermediate_size=config.intermediate_size,
            max_position_embeddings=config.max_position_embeddings,
            vocab_size=vocab_size,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
            tie_word_embeddings=False,
            rope_theta=10000.0,
        )
        model = model_cls(hf_config)
        model.train(False)
        # the two fields save_pretrained used to fill in, so config.json stays as it was
        model.config.architectures = [type(model).__name__]
        model.config.dtype = "float32"
    log.info(
        "tiny llama: %d parameters, vocab %d",
        sum(p.numel() for p in model.parameters()),
        vocab_size,
    )
    result: PreTrainedModel = model
    return result
