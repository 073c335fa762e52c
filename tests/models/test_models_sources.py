"""A GGUF shipped in pieces over several packages: assembled once into the machine's cache,
refused unless it is the pinned file and its metadata names the expected model and licence."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

import models.sources as sources
from models.errors import SourceError
from models.manifest import manifest_from_dict, manifest_to_dict
from models.sources import PackagedFile, SplitGguf, locate
from tests.models.test_models_manifest import valid_llm


def _gguf(path: Path, arch: str, licence: str | None) -> bytes:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_string("general.basename", "Qwen2.5-Coder")
    writer.add_string("general.finetune", "Instruct-AWQ")
    writer.add_uint32(f"{arch}.block_count", 24)
    if licence is not None:
        writer.add_string("general.license", licence)
    writer.add_tensor("w", np.arange(4096, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str = "qwen2",
    licence: str | None = None, pin: str | None = None,
) -> tuple[SplitGguf, bytes]:  # fmt: skip
    """Three installed packages ``fakeparts{1,2,3}`` holding a small GGUF in pieces."""
    whole = _gguf(tmp_path / "whole.gguf", arch, licence)
    site = tmp_path / "site"
    third = len(whole) // 3
    pieces = [whole[:third], whole[third : 2 * third], whole[2 * third :]]
    parts = []
    for i, piece in enumerate(pieces, 1):
        (site / f"fakeparts{i}" / "data").mkdir(parents=True)
        (site / f"fakeparts{i}" / "__init__.py").write_text("raise ImportError('never import')")
        (site / f"fakeparts{i}" / "data" / f"part{i:02d}.bin").write_bytes(piece)
        info = site / f"fakeparts{i}-0.9.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: fakeparts{i}\nVersion: 0.9.0\n"
        )
        parts.append(PackagedFile(f"fakeparts{i}", f"fakeparts{i}", f"data/part{i:02d}.bin"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("EDGEFLEET_CACHE_DIR", str(tmp_path / "cache"))
    split = SplitGguf(
        name="model.gguf",
        parts=tuple(parts),
        size=len(whole),
        sha256=pin or hashlib.sha256(whole).hexdigest(),
        metadata=(
            ("general.architecture", "qwen2"),
            ("general.basename", "Qwen2.5-Coder"),
            ("general.finetune", "Instruct*"),
            ("qwen2.block_count", 24),
        ),
        licence="Apache-2.0",
        licence_reference="the model card",
    )
    return split, whole


def test_parts_are_assembled_once_checked_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    split, whole = _split(tmp_path, monkeypatch)
    located = locate(split)
    assert located.path.read_bytes() == whole
    assert located.path.is_relative_to(tmp_path / "cache" / "sources")
    assert located.spec.sha256 == split.sha256 and located.spec.file == "model.gguf"
    assert located.spec.package == "fakeparts1,fakeparts2,fakeparts3"
    assert located.spec.package_version == "0.9.0"
    details = located.spec.details
    assert [p["package"] for p in details["assembled_from"]] == [
        "fakeparts1",
        "fakeparts2",
        "fakeparts3",
    ]
    assert sum(p["size"] for p in details["assembled_from"]) == len(whole)
    assert details["licence"] == "Apache-2.0" and details["licence_source"] == "the model card"
    assert details["gguf_metadata"]["general.architecture"] == "qwen2"
    assert '"general.basename": "Qwen2.5-Coder"' in capsys.readouterr().out

    # the second call takes the cached file without reading the parts again
    def never(*args: object) -> None:
        raise AssertionError("assembled twice")

    monkeypatch.setattr(sources, "_assemble", never)
    assert locate(split) == located


def test_the_source_details_round_trip_through_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    split, _ = _split(tmp_path, monkeypatch)
    spec = locate(split).spec
    manifest = manifest_from_dict(valid_llm())
    again = manifest_from_dict(manifest_to_dict(replace(manifest, source=spec)))
    assert again.source == spec
    assert manifest_to_dict(again)["source"]["assembled_from"][0]["package"] == "fakeparts1"


def test_another_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split, _ = _split(tmp_path, monkeypatch, pin="0" * 64)
    with pytest.raises(SourceError, match=r"expected .* sha256 0000"):
        locate(split)
    assert not list((tmp_path / "cache" / "sources").rglob("*.gguf"))


@pytest.mark.parametrize(
    ("arch", "licence", "says"),
    [
        ("llama", None, "general.architecture='llama'"),
        ("qwen2", "cc-by-nc-4.0", "general.license='cc-by-nc-4.0'"),
    ],
)
def test_other_metadata_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str, licence: str | None, says: str
) -> None:
    split, _ = _split(tmp_path, monkeypatch, arch=arch, licence=licence)
    with pytest.raises(SourceError, match="refusing to convert") as raised:
        locate(split)
    assert says in str(raised.value)
    assert not list((tmp_path / "cache" / "sources").rglob("*.gguf"))


def test_a_licence_in_the_metadata_is_taken_from_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    split, _ = _split(tmp_path, monkeypatch, licence="apache-2.0")
    details = locate(split).spec.details
    assert details["licence_source"] == "the GGUF's metadata (general.license)"
