"""``python -m benchmarks.redaction [--repeat 5] [--limit N]``: the agent's redaction next to
Presidio's pattern recognizers, on the same labeled sets, in one run.

Sets (``benchmarks/data/redaction/``, see :mod:`benchmarks.redaction_data`), reported
separately: ``generated`` (Faker in 7 locales, 38 templates, hard negatives),
``handwritten`` (written the way people write; the detectors' rules were adjusted after
reading its misses, so it is not a held-out measure) and ``heldout`` (hand-written after the
last change to the detectors and never used to change them). Per entity type: recall and
precision at span level (a labeled span is found when a predicted span of the same type
overlaps it; a predicted span is right when it overlaps a labeled span of its type), and
the share of labeled characters covered by a predicted span of any type (what stays on the
site). ``PATTERN_TYPES`` sums the six types both sides cover. Speed: MB of UTF-8 text per
second on one core (one Python thread pinned to one CPU with sched_setaffinity), the median
of ``--repeat`` passes over every document, detection only; ``redact_mb_per_s_per_core``
adds the placeholders.

Presidio (``presidio-analyzer``, dev extra) runs offline with its no-op NLP engine (its
spaCy model cannot be installed here): its pattern recognizers for e-mail, phone, card,
IBAN, IP and US SSN at its default threshold; it has no recognizer for secrets, and
without a spaCy model none for persons or addresses, so those rows are 0 for it.

Writes ``benchmarks/results/redaction.json``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.redaction import ENTITY_TYPES, Redactor, Vault
from benchmarks.redaction_data import DATA_DIR, Span, load
from benchmarks.results_file import target, write_results

Detector = Callable[[str], list[Span]]
SETS = ("generated", "handwritten", "heldout")

# Presidio's entity names -> the agent's.
PRESIDIO_TYPES = {
    "EMAIL_ADDRESS": "EMAIL",
    "PHONE_NUMBER": "PHONE",
    "CREDIT_CARD": "CREDIT_CARD",
    "IBAN_CODE": "IBAN",
    "US_SSN": "US_SSN",
    "IP_ADDRESS": "IP_ADDRESS",
    "PERSON": "PERSON",
    "LOCATION": "ADDRESS",
}


PATTERN_TYPES = ("EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "US_SSN", "IP_ADDRESS")


def ours() -> Detector:
    redactor = Redactor()

    def detect(text: str) -> list[Span]:
        return [(s.start, s.end, s.type) for s in redactor.detect(text)]

    return detect


def presidio() -> Detector:
    import tldextract
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider
    from presidio_analyzer.predefined_recognizers import EmailRecognizer

    logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)
    nlp = NlpEngineProvider(
        nlp_configuration={
            "nlp_engine_name": "no_op",
            "models": [{"lang_code": "en", "model_name": "none"}],
        }
    ).create_engine()
    engine = AnalyzerEngine(nlp_engine=nlp, supported_languages=["en"])
    # offline: the e-mail recognizer's tldextract uses its bundled suffix list
    quiet = tldextract.TLDExtract(suffix_list_urls=())
    for rec in engine.registry.recognizers:
        if isinstance(rec, EmailRecognizer):
            import presidio_analyzer.predefined_recognizers.generic.email_recognizer as mod

            mod.tldextract = types.SimpleNamespace(extract=quiet)  # type: ignore[attr-defined,assignment]
    wanted = list(PRESIDIO_TYPES)

    def detect(text: str) -> list[Span]:
        results = engine.analyze(text=text, language="en", entities=wanted)
        return [(r.start, r.end, PRESIDIO_TYPES[r.entity_type]) for r in results]

    return detect


def _overlaps(a: Span, b: Span) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def score(docs: list[tuple[str, list[Span]]], detect: Detector) -> dict[str, Any]:
    per: dict[str, dict[str, int]] = {
        t: {"gold": 0, "found": 0, "predicted": 0, "right": 0, "chars": 0, "covered": 0}
        for t in ENTITY_TYPES
    }
    false_positives: list[dict[str, str]] = []
    missed: list[dict[str, str]] = []
    for text, gold in docs:
        pred = detect(text)
        for g in gold:
            row = per[g[2]]
            row["gold"] += 1
            row["chars"] += g[1] - g[0]
            if any(p[2] == g[2] and _overlaps(p, g) for p in pred):
                row["found"] += 1
            elif len(missed) < 400:
                missed.append({"type": g[2], "value": text[g[0] : g[1]]})
            covered: set[int] = set()
            for p in pred:
                covered.update(range(max(p[0], g[0]), min(p[1], g[1])))
            row["covered"] += len(covered)
        for p in pred:
            row = per[p[2]]
            row["predicted"] += 1
            if any(g[2] == p[2] and _overlaps(p, g) for g in gold):
                row["right"] += 1
            elif len(false_positives) < 400:
                false_positives.append({"type": p[2], "value": text[p[0] : p[1]]})
    out: dict[str, Any] = {}
    totals = {k: sum(r[k] for r in per.values()) for k in next(iter(per.values()))}
    # the six types Presidio's pattern recognizers cover: the like-for-like comparison
    common = {k: sum(per[t][k] for t in PATTERN_TYPES) for k in totals}
    for t, r in [*per.items(), ("PATTERN_TYPES", common), ("ALL", totals)]:
        if r["gold"] == 0 and r["predicted"] == 0:
            continue
        out[t] = {
            "spans": r["gold"],
            "recall": round(r["found"] / r["gold"], 4) if r["gold"] else None,
            "precision": round(r["right"] / r["predicted"], 4) if r["predicted"] else None,
            "chars_covered": round(r["covered"] / r["chars"], 4) if r["chars"] else None,
            "predicted": r["predicted"],
        }
    return {"by_type": out, "missed": missed, "false_positives": false_positives}


def throughput(docs: list[tuple[str, list[Span]]], detect: Detector, repeat: int) -> float:
    texts = [t for t, _ in docs]
    size = sum(len(t.encode()) for t in texts)
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for t in texts:
            detect(t)
        runs.append(time.perf_counter() - started)
    return round(size / statistics.median(runs) / 1e6, 3)


def redact_throughput(docs: list[tuple[str, list[Span]]], repeat: int) -> float:
    """Detection plus placeholders (what a request pays): MB/s on one core."""
    redactor = Redactor()
    texts = [t for t, _ in docs]
    size = sum(len(t.encode()) for t in texts)
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for t in texts:
            redactor.redact(t, Vault())
        runs.append(time.perf_counter() - started)
    return round(size / statistics.median(runs) / 1e6, 3)


def _pin_to_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})
        return f"cpu {cpus[-1]}"
    return "not pinned"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed passes (median)")
    parser.add_argument("--limit", type=int, default=0, help="documents per set (0: all)")
    parser.add_argument("--no-presidio", action="store_true", help="only the agent's own")
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    pinned = _pin_to_one_core()
    detectors: dict[str, Detector] = {"edgefleet": ours()}
    if not args.no_presidio:
        detectors["presidio_patterns"] = presidio()
    figures: dict[str, Any] = {"pinned": pinned, "repeat": args.repeat, "sets": {}}
    for name in SETS:
        docs = load(args.data / f"{name}.txt")
        if args.limit:
            docs = docs[: args.limit]
        entry: dict[str, Any] = {
            "documents": len(docs),
            "spans": sum(len(s) for _, s in docs),
            "bytes": sum(len(t.encode()) for t, _ in docs),
        }
        for label, detect in detectors.items():
            result = score(docs, detect)
            result["mb_per_s_per_core"] = throughput(docs, detect, args.repeat)
            entry[label] = result
        entry["edgefleet"]["redact_mb_per_s_per_core"] = redact_throughput(docs, args.repeat)
        figures["sets"][name] = entry
    targets: dict[str, dict[str, Any]] = {}
    if "presidio_patterns" in detectors:
        for name in SETS:
            ours_all = figures["sets"][name]["edgefleet"]["by_type"]["ALL"]
            theirs = figures["sets"][name]["presidio_patterns"]["by_type"].get("ALL", {})
            ours_common = figures["sets"][name]["edgefleet"]["by_type"]["PATTERN_TYPES"]
            theirs_common = figures["sets"][name]["presidio_patterns"]["by_type"].get(
                "PATTERN_TYPES", {}
            )
            for scope, a, b in (("all", ours_all, theirs), ("pattern_types", ours_common,
                                                             theirs_common)):  # fmt: skip
                for metric in ("recall", "precision"):
                    mine, other = a[metric] or 0.0, b.get(metric) or 0.0
                    targets[f"{name}_{scope}_{metric}_vs_presidio"] = target(
                        round(mine - other, 4), "edgefleet - presidio >= 0", mine >= other
                    )
            speed = figures["sets"][name]
            ratio = speed["edgefleet"]["mb_per_s_per_core"] / max(
                speed["presidio_patterns"]["mb_per_s_per_core"], 1e-9
            )
            targets[f"{name}_speed_vs_presidio"] = target(
                round(ratio, 2), "edgefleet / presidio MB/s >= 1", ratio >= 1
            )
    path = write_results("redaction", figures, targets)
    _print_table(figures)
    print(path)


def _print_table(figures: dict[str, Any]) -> None:
    for name, entry in figures["sets"].items():
        print(f"\n{name}: {entry['documents']} documents, {entry['spans']} spans")
        labels = [k for k in entry if isinstance(entry[k], dict) and "by_type" in entry[k]]
        header = f"{'type':12}" + "".join(f"{lab[:18]:>28}" for lab in labels)
        print(header + "\n" + " " * 12 + "".join(f"{'recall prec chars':>28}" for _ in labels))
        for t in [*ENTITY_TYPES, "PATTERN_TYPES", "ALL"]:
            cells = []
            for lab in labels:
                r = entry[lab]["by_type"].get(t)
                if r is None:
                    cells.append(f"{'-':>28}")
                    continue
                rec, prec, ch = r["recall"], r["precision"], r["chars_covered"]
                cells.append(f"{_f(rec):>12} {_f(prec):>6} {_f(ch):>6} ({r['spans']:>3})".rjust(28))
            print(f"{t[:12]:12}" + "".join(cells))
        print("MB/s/core   " + "".join(f"{entry[lab]['mb_per_s_per_core']:>28}" for lab in labels))


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()
