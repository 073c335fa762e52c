"""The tiny-llama artifact: its graph matches its manifest, it runs, and the cache holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models.manifest import load_manifest, verify_files


def test_graph_names_match_manifest(tiny_out: Path) -> None:
    import onnxruntime as ort

    directory = tiny_out / "tiny-llama"
    manifest = load_manifest(directory)
    verify_files(manifest, directory)
    session = ort.InferenceSession(
        str(directory / manifest.graph.onnx), providers=["CPUExecutionProvider"]
    )
    assert tuple(i.name for i in session.get_inputs()) == manifest.graph.inputs
    assert tuple(o.name for o in session.get_outputs()) == manifest.graph.outputs
    llm = manifest.llm
    assert llm is not None
    assert (llm.num_layers, llm.num_attention_heads, llm.num_kv_heads, llm.head_dim) == (
        2,
        4,
        2,
        16,
    )
    assert llm.vocab_size == 49152
    for layer in range(llm.num_layers):
        assert llm.past_key_template.format(layer=layer) in manifest.graph.inputs
        assert llm.present_value_template.format(layer=layer) in manifest.graph.outputs
    assert manifest.task == "text-generation" and manifest.variant == "fp32"
    assert manifest.special_tokens.eos_token_ids == (2,)
    assert manifest.context_length == 512
    assert manifest.chat_template is not None and "<|im_start|>" in manifest.chat_template


def test_decode_with_cache_matches_full_prefill(tiny_out: Path) -> None:
    from models.ort_llm import OrtDecoder

    directory = tiny_out / "tiny-llama"
    manifest = load_manifest(directory)
    assert manifest.llm is not None
    decoder = OrtDecoder(directory / manifest.graph.onnx, manifest.llm, threads=1)
    prompt = [1, 9690, 198, 28120, 905]
    generation = decoder.greedy(prompt, max_new=6, stop_at_eos=False)
    assert len(generation.tokens) == 6
    # the same tokens scored in one pass (empty past) give the same greedy choices
    logits, _ = decoder.forward(prompt + generation.tokens[:-1], decoder.empty_past(), 0)
    assert [int(t) for t in np.argmax(logits[len(prompt) - 1 :], axis=-1)] == generation.tokens


def test_tokenizer_json_encodes_chat_without_special_tokens(tiny_out: Path) -> None:
    from tokenizers import Tokenizer

    from models.gate import render_chat

    manifest = load_manifest(tiny_out / "tiny-llama")
    tokenizer = Tokenizer.from_file(str(tiny_out / "tiny-llama" / manifest.tokenizer.file))
    assert manifest.chat_template is not None
    text = render_chat(manifest.chat_template, "Hello, world!  How are you?")
    ids = tokenizer.encode(text, add_special_tokens=manifest.tokenizer.add_special_tokens).ids
    assert ids[0] == 1  # <|im_start|> as one token, no extra BOS
    assert ids.count(2) == 2  # two <|im_end|>
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_the_deep_variant_is_a_bigger_network_with_the_same_interface(tiny_out: Path) -> None:
    """_variants/tiny-llama-deep: the build's other tiny-llama version, a bigger random
    network of its own seed (the rollout TTFT gate's slower version), that loads and runs
    as the tiny model does."""
    import json

    from models.build import variant_dir
    from models.build_tiny import CONFIG, DEEP
    from models.ort_llm import OrtDecoder

    directory = variant_dir(tiny_out, "tiny-llama", "deep")
    manifest = load_manifest(directory)
    verify_files(manifest, directory)
    tiny = load_manifest(tiny_out / "tiny-llama")
    assert manifest.name == "tiny-llama-deep" and manifest.variant == "fp32"
    assert manifest.build_key == tiny.build_key
    assert manifest.version.startswith("fp32-") and manifest.version != tiny.version
    llm = manifest.llm
    assert llm is not None and tiny.llm is not None
    assert (llm.num_layers, llm.num_attention_heads, llm.num_kv_heads, llm.head_dim) == (
        DEEP.num_hidden_layers,
        DEEP.num_attention_heads,
        DEEP.num_key_value_heads,
        DEEP.hidden_size // DEEP.num_attention_heads,
    )
    config = json.loads((directory / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"]) == (
        DEEP.hidden_size,
        DEEP.intermediate_size,
    )
    assert DEEP.seed != CONFIG.seed
    # the same interface: tokenizer, chat template, special tokens, context, graph names
    assert (directory / "tokenizer.json").read_bytes() == (
        tiny_out / "tiny-llama" / "tokenizer.json"
    ).read_bytes()
    assert manifest.chat_template == tiny.chat_template
    assert manifest.special_tokens == tiny.special_tokens
    assert manifest.context_length == tiny.context_length
    assert llm.vocab_size == tiny.llm.vocab_size == 49152
    assert llm.past_key_template == tiny.llm.past_key_template
    assert set(tiny.graph.inputs) <= set(manifest.graph.inputs)
    decoder = OrtDecoder(directory / manifest.graph.onnx, llm, threads=1)
    prompt = [1, 9690, 198, 28120, 905]
    generation = decoder.greedy(prompt, max_new=6, stop_at_eos=False)
    assert len(generation.tokens) == 6
    logits, _ = decoder.forward(prompt + generation.tokens[:-1], decoder.empty_past(), 0)
    assert [int(t) for t in np.argmax(logits[len(prompt) - 1 :], axis=-1)] == generation.tokens


def test_the_deep_variant_is_part_of_the_targets_cache_check(
    tiny_out: Path, tmp_path: Path
) -> None:
    import shutil

    from models.build import TARGETS, is_up_to_date, variant_dir
    from models.context import BuildOptions, compute_build_key
    from models.sources import locate

    target = TARGETS["tiny-llama"]
    key = compute_build_key(
        locate(target.source).spec.sha256, target.key_options(BuildOptions(out=tiny_out))
    )
    out = tmp_path / "out"
    shutil.copytree(tiny_out, out)
    assert is_up_to_date(out, target, key)
    shutil.rmtree(variant_dir(out, "tiny-llama", "deep"))
    assert not is_up_to_date(out, target, key)
    # another target's variant directory in its place is not it either
    shutil.copytree(tiny_out / "tiny-llama", variant_dir(out, "tiny-llama", "deep"))
    assert not is_up_to_date(out, target, key)


def test_second_build_is_cached_and_rewrites_nothing(tiny_out: Path) -> None:
    directory = tiny_out / "tiny-llama"
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [sys.executable, "-m", "models", "build", "--out", str(tiny_out), "--only", "tiny-llama"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert "tiny-llama: up to date (cached)" in result.stdout
    after = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    assert after == before


def test_other_build_key_is_not_cached(tiny_out: Path) -> None:
    from models.build import TARGETS, is_up_to_date
    from models.context import BuildOptions, compute_build_key
    from models.sources import locate

    target = TARGETS["tiny-llama"]
    options = BuildOptions(out=tiny_out)
    key = compute_build_key(locate(target.source).spec.sha256, target.key_options(options))
    assert is_up_to_date(tiny_out, target, key)
    assert not is_up_to_date(tiny_out, target, "0" * 64)


@pytest.mark.parametrize("flag", ["--out", "--only", "--force", "--skip-gate", "--threads"])
def test_cli_help_documents_every_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    from models.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["build", "--help"])
    assert exc.value.code == 0
    assert flag in capsys.readouterr().out


def test_a_target_is_copied_from_the_machines_shared_cache(
    tiny_out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone whose artifacts are missing takes a target from the shared cache when the
    build key, the pipeline's code and the converters' versions all match."""
    from models import build as build_module
    from models.build import TARGETS, build
    from models.context import BuildOptions, compute_build_key
    from models.sources import locate

    target = TARGETS["tiny-llama"]
    key = compute_build_key(
        locate(target.source).spec.sha256, target.key_options(BuildOptions(out=tiny_out))
    )
    shared_root = tmp_path / "shared"
    shared = build_module._shared_dir(shared_root, target, key)
    assert shared is not None
    build_module._store(shared, tiny_out, target)
    report = build(BuildOptions(out=tmp_path / "clone", only=("tiny-llama",),
                                shared_cache=shared_root))  # fmt: skip
    entry = report["last_run"]["targets"]["tiny-llama"]
    assert entry["cached"] is True and entry["shared_cache"] == str(shared)
    copied = tmp_path / "clone" / "tiny-llama"
    verify_files(load_manifest(copied), copied)  # every file's sha256 checked
    assert not copied.is_symlink() and not (copied / "model.onnx").samefile(
        tiny_out / "tiny-llama" / "model.onnx"
    )
    deep = tmp_path / "clone" / "_variants" / "tiny-llama-deep"
    verify_files(load_manifest(deep), deep)  # the deep variant came along
    # other pipeline code (or converter versions): another entry, never this one
    monkeypatch.setattr(build_module, "_pipeline_digest", lambda *_args: "other code")
    assert build_module._shared_dir(shared_root, target, key) != shared
    # an entry whose files do not hold is not restored
    (shared / "tiny-llama" / "model.onnx").write_bytes(b"truncated")
    assert not build_module._restore(shared, tmp_path / "clone2", target, key)


def _package_copy(where: Path, edit: str = "") -> Path:
    """A copy of the models package's modules, one of them (``edit``) changed."""
    import models

    root = where / "models"
    root.mkdir(parents=True)
    for module in Path(models.__file__).parent.glob("*.py"):
        text = module.read_text()
        (root / module.name).write_text(text + ("\n# changed\n" if module.name == edit else ""))
    return root


def test_a_builders_change_leaves_the_other_targets_cache_entries_valid(tmp_path: Path) -> None:
    """The shared cache's pipeline digest covers the build driver and what a target's
    builder imports: the moderation heads' builder changing keeps every other target's
    entry; a module they share (context.py) changing moves them all."""
    from models.build import TARGETS, _pipeline_digest

    builders = {name: target.module for name, target in TARGETS.items()}
    assert builders["tiny-llama"] == "models.build_tiny"
    assert builders["moderation/all-minilm-l6-v2"] == "models.build_moderation"

    def digests(root: Path) -> dict[str, str]:
        return {name: _pipeline_digest(module, root) for name, module in builders.items()}

    base = digests(_package_copy(tmp_path / "a"))
    heads = digests(_package_copy(tmp_path / "b", edit="build_moderation.py"))
    shared = digests(_package_copy(tmp_path / "c", edit="context.py"))
    assert heads["moderation/all-minilm-l6-v2"] != base["moderation/all-minilm-l6-v2"]
    assert {n: d for n, d in heads.items() if n != "moderation/all-minilm-l6-v2"} == {
        n: d for n, d in base.items() if n != "moderation/all-minilm-l6-v2"
    }
    assert all(shared[name] != base[name] for name in builders)
