"""The redaction benchmark's labeled sets: the held-out set is read with its regions, is the
committed file (a changed copy is refused, by the function and by the command), and is
scored per region, per script and on its negative documents."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.redaction import (
    PINNED,
    SETS,
    ChangedSet,
    check_pinned,
    score,
    script_of,
)
from benchmarks.redaction_data import DATA_DIR, Document, Span, load, load_documents
from benchmarks.redaction_heldout import REGIONS

HELDOUT = DATA_DIR / SETS["heldout_world"]


@pytest.mark.parametrize("name", ["heldout_world", "heldout_world_2"])
def test_the_committed_heldout_sets_match_their_pins(name: str) -> None:
    path = DATA_DIR / SETS[name]
    assert path.name in PINNED
    check_pinned(path)  # raises on any change


def test_the_second_heldout_set_is_its_own() -> None:
    """Written with its own seed and templates: no document of the first set is in it."""
    first = {d.text for d in load_documents(HELDOUT)}
    second = load_documents(DATA_DIR / SETS["heldout_world_2"])
    assert len(second) > 500
    assert {d.notes.get("region") for d in second} >= {*REGIONS, "structured"}
    assert not [d.text for d in second if d.text in first]


def test_a_changed_copy_is_refused(tmp_path: Path) -> None:
    changed = tmp_path / HELDOUT.name
    changed.write_bytes(HELDOUT.read_bytes().replace(b"[[PERSON|", b"[[ADDRESS|", 1))
    with pytest.raises(ChangedSet, match="sha256"):
        check_pinned(changed)
    # a file nobody pinned is not checked
    unpinned = tmp_path / "handwritten.txt"
    shutil.copy(DATA_DIR / "handwritten.txt", unpinned)
    check_pinned(unpinned)


def test_the_command_refuses_a_changed_heldout_set(tmp_path: Path) -> None:
    (tmp_path / HELDOUT.name).write_text(
        HELDOUT.read_text(encoding="utf-8") + "---\none more document\n", encoding="utf-8"
    )
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.redaction", "--data", str(tmp_path),
         "--sets", "heldout_world", "--no-presidio", "--repeat", "1"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert run.returncode == 2
    assert "was changed" in run.stderr


def test_every_heldout_document_names_its_region_and_kind() -> None:
    docs = load_documents(HELDOUT)
    assert len(docs) == len(load(HELDOUT)) > 500
    assert all(d.notes.get("kind") in ("positive", "negative") for d in docs)
    positives = Counter(d.notes["region"] for d in docs if d.notes["kind"] == "positive")
    assert set(REGIONS) <= set(positives)
    for region in REGIONS:
        types = Counter(t for d in docs if d.notes["region"] == region for *_, t in d.spans)
        assert types["PERSON"] >= 30 and types["ADDRESS"] >= 10, region
    negatives = [d for d in docs if d.notes["kind"] == "negative"]
    assert len(negatives) >= 50 and not any(d.spans for d in negatives)
    scripts = Counter(script_of(d.text[a:b]) for d in docs for a, b, t in d.spans if t == "PERSON")
    assert {"latin", "cjk", "hangul", "cyrillic"} <= set(scripts)


@pytest.mark.parametrize(
    ("value", "script"),
    [("佐藤 愛子", "cjk"), ("〒150-0001 東京都渋谷区", "cjk"), ("김민준", "hangul"),
     ("Иван Петров", "cyrillic"), ("Müller", "latin"), ("172", "none")],
)  # fmt: skip
def test_script_of(value: str, script: str) -> None:
    assert script_of(value) == script


def test_scores_per_region_script_and_negative_document() -> None:
    docs = [
        Document("Call Yuki Tanaka now", [(5, 16, "PERSON")], {"region": "japan"}),
        Document("Ship to 田中太郎", [(8, 12, "PERSON")], {"region": "japan"}),
        Document("Иван Петров звонил", [(0, 11, "PERSON")], {"region": "slavic"}),
        Document("the rose garden", [], {"region": "common_words", "kind": "negative"}),
    ]

    def detect(text: str) -> list[Span]:  # finds Latin names only, and one false alarm
        found: list[Span] = []
        if "Yuki" in text:
            found.append((5, 16, "PERSON"))
        if "rose" in text:
            found.append((4, 8, "PERSON"))
        return found

    result = score(docs, detect)
    assert result["by_type"]["PERSON"]["recall"] == round(1 / 3, 4)
    assert result["by_type"]["PERSON"]["precision"] == 0.5
    assert result["by_region"]["japan"]["PERSON"]["recall"] == 0.5
    assert result["by_region"]["slavic"]["PERSON"]["recall"] == 0.0
    assert result["by_script"]["latin"]["PERSON"] == {
        "spans": 1, "recall": 1.0, "precision": 0.5, "chars_covered": 1.0, "predicted": 2,
    }  # fmt: skip
    assert result["by_script"]["cjk"]["PERSON"]["recall"] == 0.0
    assert result["negatives"]["documents"] == 1
    assert result["negatives"]["with_any_span"] == 1
    assert result["negatives"]["flagged"][0]["spans"] == [{"type": "PERSON", "value": "rose"}]


def test_the_4kb_prompt_is_4kb_of_one_kind_of_heldout_document() -> None:
    from benchmarks.redaction import prompt_4kb

    docs = load_documents(HELDOUT)
    dense = prompt_4kb(docs)
    clean = prompt_4kb(docs, "negative")
    assert 3500 <= len(dense.encode()) <= 4096 and 3000 <= len(clean.encode()) <= 4096
    positives = [d.text for d in docs if d.notes.get("kind") == "positive"]
    negatives = [d.text for d in docs if d.notes.get("kind") == "negative"]
    assert dense.startswith(positives[0]) and clean.startswith(negatives[0])


def test_the_4kb_latency_with_ner_runs_the_model_on_every_request() -> None:
    from benchmarks.redaction import request_latency

    seen: list[str] = []
    figures = request_latency("Hi Anna Schmidt, call 030 1234567.", 10, seen.append)  # type: ignore[arg-type]
    assert len(seen) == 3 + 10 and set(seen) == {"Hi Anna Schmidt, call 030 1234567."}
    assert figures["runs"] == 10 and 0 < figures["p50_ms"] <= figures["p99_ms"]


def test_the_ner_persons_are_added_only_where_the_agent_found_nothing() -> None:
    from benchmarks.redaction import _with_ner_persons

    mine: list[Span] = [(0, 5, "PERSON"), (10, 20, "ADDRESS")]
    theirs: list[Span] = [
        (1, 4, "PERSON"),
        (12, 15, "PERSON"),
        (30, 35, "PERSON"),
        (40, 45, "ADDRESS"),
    ]
    both = _with_ner_persons(lambda _t: list(mine), lambda _t: list(theirs))("x" * 50)
    assert both == [*mine, (30, 35, "PERSON")]


def test_the_filtered_ner_persons_are_those_the_lexicon_allows() -> None:
    from benchmarks.redaction import _with_ner_persons, lexicon_allows

    def span(text: str, value: str) -> Span:
        return (text.index(value), text.index(value) + len(value), "PERSON")

    text = "Ask Bolanle Oyelaran. Install the Debian packages. Flights to Valencia. Send Invoice"
    theirs = [span(text, v) for v in ("Bolanle Oyelaran", "Debian", "Valencia", "Invoice")]
    assert [lexicon_allows(text, s) for s in theirs] == [True, False, False, False]
    both = _with_ner_persons(lambda _t: [], lambda _t: list(theirs), keep=lexicon_allows)(text)
    assert both == [theirs[0]]
    # without the predicate every person the agent did not find is added
    assert _with_ner_persons(lambda _t: [], lambda _t: list(theirs))(text) == theirs


def test_the_second_heldout_sets_misses_are_written_as_counts_only() -> None:
    """Whoever changes the detectors reads the results file: a set whose misses were read
    is a tuning set, so the second held-out set's are not in it."""
    from benchmarks.redaction import HELDOUT_2, UNREAD, _counts_only

    assert HELDOUT_2 in UNREAD
    entry = {
        "edgefleet": {"missed": [{"value": "Ada"}], "false_positives": [], "recall": 0.5},
        "documents": 3,
    }
    _counts_only(entry)
    assert entry["edgefleet"] == {"missed_count": 1, "false_positives_count": 0, "recall": 0.5}
