"""Load a causal language model (Llama family) and its tokenizer from a GGUF file.

The graph itself is written by :mod:`models.llama_graph`. Heavy libraries (torch,
transformers) are imported inside the functions.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from models._quiet import offline_env, quiet
from models.errors import ConversionError
from models.manifest import SpecialTokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "PAST_KEY",
    "PAST_VALUE",
    "PRESENT_KEY",
    "PRESENT_VALUE",
    "SMOLLM2_SPECIAL_TOKENS",
    "load_gguf_model_untied",
    "load_gguf_tokenizer",
    "save_tokenizer_json",
]

log = logging.getLogger(__name__)

PAST_KEY: Final = "past_key_values.{layer}.key"
PAST_VALUE: Final = "past_key_values.{layer}.value"
PRESENT_KEY: Final = "present.{layer}.key"
PRESENT_VALUE: Final = "present.{layer}.value"

# The GGUF-converted tokenizer reports eos "<|im_start|>"; the end of a turn is <|im_end|> (2),
# as in SmolLM2's generation_config. Padding reuses it.
SMOLLM2_SPECIAL_TOKENS: Final = SpecialTokens(
    bos_token_id=1,
    eos_token_ids=(2,),
    pad_token_id=2,
    bos_token="<|im_start|>",
    eos_token="<|im_end|>",
)


def load_gguf_tokenizer(gguf_path: Path) -> PreTrainedTokenizerBase:
    """Convert the tokenizer stored in a GGUF file (about 10 s)."""
    offline_env()
    with quiet():
        from transformers import AutoTokenizer

        loader: Any = AutoTokenizer.from_pretrained
        try:
            tokenizer: PreTrainedTokenizerBase = loader(
                str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
            )
            return tokenizer
        except Exception as exc:  # library boundary
            raise ConversionError(f"cannot read tokenizer from {gguf_path}: {exc}") from exc


def save_tokenizer_json(tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Write the fast tokenizer in Hugging Face ``tokenizers`` JSON format."""
    backend: Any = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConversionError("tokenizer has no fast (tokenizers) backend")
    backend.save(str(path))


def load_gguf_model_untied(gguf_path: Path) -> PreTrainedModel:
    """Load a GGUF checkpoint as float32 and untie lm_head from the token embedding.

    Untying makes the output projection a plain MatMul weight in the exported graph, so the
    quantizers can reach it (a tied head is exported as a Transpose of the embedding).
    """
    offline_env()
    with quiet():
        import torch
        from transformers import AutoModelForCausalLM

        try:
            model: Any = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent),
                gguf_file=gguf_path.name,
                dtype=torch.float32,
                local_files_only=True,
            )
        except Exception as exc:  # library boundary
            raise ConversionError(f"cannot load {gguf_path} with transformers: {exc}") from exc
        model.train(False)
        if model.config.tie_word_embeddings or (
            model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        ):
            model.config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(
                model.get_input_embeddings().weight.detach().clone()
            )
            log.info("untied lm_head from the token embedding")
    result: PreTrainedModel = model
    return result


def remove_tree(path: Path) -> None:
    """Delete a work directory, ignoring one that is already gone."""
    shutil.rmtree(path, ignore_errors=True)
