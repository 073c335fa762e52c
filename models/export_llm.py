"""Export a causal language model (Llama family) to one ONNX decoder graph with KV cache.

optimum-onnx 0.1.0 with task ``text-generation-with-past`` writes a single ``model.onnx``
whose ``past_key_values.*`` inputs accept past length 0 (prefill) as well as a real cache
(decode). :func:`export_decoder` checks that this is what came out.

Heavy libraries (torch, transformers, optimum) are imported inside the functions.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from models._quiet import offline_env, quiet
from models.errors import ConversionError
from models.manifest import LlmSpec, SpecialTokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "PAST_KEY",
    "PAST_VALUE",
    "PRESENT_KEY",
    "PRESENT_VALUE",
    "SMOLLM2_SPECIAL_TOKENS",
    "export_decoder",
    "llm_spec",
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


def export_decoder(model_dir: Path, out_dir: Path) -> Path:
    """Export the HF checkpoint in ``model_dir`` to ``out_dir/model.onnx`` (fp32, with past).

    Returns the path of the graph. Raises ConversionError unless exactly one decoder graph
    with ``past_key_values`` inputs was written.
    """
    offline_env()
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet():
        from optimum.exporters.onnx import main_export

        try:
            main_export(
                str(model_dir),
                output=str(out_dir),
                task="text-generation-with-past",
                device="cpu",
                dtype="fp32",
                do_validation=False,
                local_files_only=True,
                library_name="transformers",
            )
        except Exception as exc:  # library boundary
            raise ConversionError(f"optimum export of {model_dir} failed: {exc}") from exc
    graphs = sorted(p.name for p in out_dir.glob("*.onnx"))
    if graphs != ["model.onnx"]:
        raise ConversionError(f"expected a single model.onnx from optimum, got {graphs}")
    return out_dir / "model.onnx"


def llm_spec(config: Any, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> LlmSpec:
    """Shapes from the HF config, checked against the graph's tensor names."""
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    expected_in = {"input_ids", "attention_mask"}
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
        vocab_size=int(config.vocab_size),
        past_key_template=PAST_KEY,
        past_value_template=PAST_VALUE,
        present_key_template=PRESENT_KEY,
        present_value_template=PRESENT_VALUE,
        uses_position_ids="position_ids" in inputs,
    )


def remove_tree(path: Path) -> None:
    """Delete a work directory, ignoring one that is already gone."""
    shutil.rmtree(path, ignore_errors=True)
