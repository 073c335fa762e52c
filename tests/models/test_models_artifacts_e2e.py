"""The real artifacts under models/artifacts (built by ``python -m models build``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.manifest import load_manifest, verify_files

pytestmark = pytest.mark.e2e

LLM = "smollm2-135m-instruct"
EMBEDDING = "all-minilm-l6-v2"
QWEN = "qwen2.5-coder-0.5b-instruct"  # its fp32 reference is measured, never kept
VARIANTS = {LLM: {"fp32", "int8", "int4"}, EMBEDDING: {"fp32", "int8"}, QWEN: {"int8", "int4"}}
ARTIFACTS = Path()


@pytest.fixture(autouse=True)
def _artifacts(real_artifacts: Path) -> None:
    """The real artifacts (built on demand by the shared ``real_artifacts`` fixture)."""
    global ARTIFACTS
    ARTIFACTS = real_artifacts


def _dirs(name: str) -> list[Path]:
    shipped = ARTIFACTS / name
    return [shipped, *sorted((ARTIFACTS / "_variants").glob(f"{name}-*"))]


@pytest.mark.parametrize("name", [LLM, EMBEDDING, QWEN])
def test_every_directory_matches_its_manifest(name: str) -> None:
    import onnxruntime as ort

    dirs = _dirs(name)
    variants = set()
    for directory in dirs:
        manifest = load_manifest(directory)
        verify_files(manifest, directory)
        variants.add(manifest.variant)
        session = ort.InferenceSession(
            str(directory / manifest.graph.onnx), providers=["CPUExecutionProvider"]
        )
        assert tuple(i.name for i in session.get_inputs()) == manifest.graph.inputs
        assert tuple(o.name for o in session.get_outputs()) == manifest.graph.outputs
        assert manifest.accuracy is not None and manifest.benchmark is not None
    assert variants == VARIANTS[name]
    shipped = load_manifest(dirs[0])
    assert shipped.name == name
    assert shipped.accuracy is not None and shipped.accuracy["passed"] is True


def test_shipped_llm_answers_easy_facts_and_stops() -> None:
    from tokenizers import Tokenizer

    from models.gate import render_chat
    from models.ort_llm import OrtDecoder

    directory = _dirs(LLM)[0]
    manifest = load_manifest(directory)
    assert manifest.llm is not None and manifest.chat_template is not None
    tokenizer = Tokenizer.from_file(str(directory / manifest.tokenizer.file))
    decoder = OrtDecoder(directory / manifest.graph.onnx, manifest.llm, threads=2)
    facts = {
        "Name the capital of France.": "paris",
        "What is the capital of Japan?": "tokyo",
        "What is the capital of Germany?": "berlin",
        "What is the chemical symbol for water?": "h2o",
        "What is the largest ocean on Earth?": "pacific",
        "What is the tallest mountain in the world?": "everest",
    }
    right = 0
    stopped = 0
    for question, answer in facts.items():
        text = render_chat(manifest.chat_template, question)
        ids = tokenizer.encode(text, add_special_tokens=manifest.tokenizer.add_special_tokens).ids
        generation = decoder.greedy(ids, 40, manifest.special_tokens.eos_token_ids)
        right += answer in tokenizer.decode(generation.tokens, skip_special_tokens=True).lower()
        stopped += generation.stopped_at_eos
    assert right >= 5  # of 6
    assert stopped >= 1  # ends its turn with <|im_end|>


def test_shipped_embedding_ranks_paraphrase_first() -> None:
    from models.export_embedding import embed
    from models.ort_llm import make_session

    directory = _dirs(EMBEDDING)[0]
    manifest = load_manifest(directory)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / manifest.tokenizer.file))
    session = make_session(directory / manifest.graph.onnx, threads=2)
    vectors = embed(
        session,
        tokenizer,
        [
            "How do I reset my password?",
            "I forgot my password, how can I change it?",
            "Whales live in the ocean.",
        ],
    )
    assert manifest.embedding is not None and vectors.shape == (3, manifest.embedding.dim)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
