"""The moderation heads beside ``alt-profanity-check`` on the heads' held-out test split.

``alt-profanity-check`` (a linear model over a bag of words, trained on offensive
language) runs in its own interpreter (it pins scikit-learn and joblib, which the project
does not depend on): give it with ``--baseline-python``, a Python with
``scikit-learn==1.9.1``, ``joblib==1.6.0`` and ``alt-profanity-check`` installed
(``--no-deps``). Its two joblib files are loaded there, never in this process.

Compared where comparable: its profanity probability against the ``harassment`` head on
the harassment test set, and against "flagged" (any content category) on all harmful test
texts, each at its own threshold and at the false-positive rate the heads have on the
ordinary questions of the test split.

    python -m benchmarks.moderation_baseline --baseline-python /tmp/apc-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.results_file import target, write_results
from models.build_moderation import EMBEDDING_MODEL, NAME, WindowEmbedder, _role, _split_of
from models.moderation_data import load_rows
from models.moderation_spec import CATEGORIES, HEADS_FILE, MINORS, PROMPT_INJECTION

RESULTS = "moderation_baseline"
_BASELINE = r"""
import json, sys
from importlib import resources
import joblib
root = resources.files("profanity_check") / "data"  # located, the package not imported
vectorizer = joblib.load(root / "vectorizer.joblib")
model = joblib.load(root / "model.joblib")
texts = json.load(sys.stdin)
print(json.dumps(model.predict_proba(vectorizer.transform(texts))[:, 1].tolist()))
"""


def baseline_scores(python: str, texts: list[str]) -> npt.NDArray[np.float64]:
    out = subprocess.run(
        [python, "-c", _BASELINE],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return np.asarray(json.loads(out.stdout), dtype=np.float64)


def heads_scores(
    artifacts: Path, texts: list[str]
) -> tuple[npt.NDArray[np.float64], dict[str, Any]]:
    """Worst-window scores (texts x categories) and the heads' metadata."""
    import onnxruntime as ort

    embedder = WindowEmbedder(artifacts / EMBEDDING_MODEL, threads=2)
    session = ort.InferenceSession(
        str(artifacts / NAME / HEADS_FILE), providers=["CPUExecutionProvider"]
    )
    meta = json.loads(session.get_modelmeta().custom_metadata_map["edgefleet.moderation"])
    per_text = embedder.windows(texts)
    flat = [w for ws in per_text for w in ws]
    scores = session.run(["scores"], {"embedding": embedder.embed_all(flat)})[0]
    out, start = [], 0
    for ws in per_text:
        out.append(scores[start : start + len(ws)].max(axis=0))
        start += len(ws)
    return np.asarray(out, dtype=np.float64), meta


def _rates(flagged: npt.NDArray[np.bool_], truth: npt.NDArray[np.int64]) -> dict[str, Any]:
    tp = int(np.sum(flagged & (truth == 1)))
    fp = int(np.sum(flagged & (truth == 0)))
    pos = int(np.sum(truth == 1))
    return {
        "recall": round(tp / pos, 4) if pos else None,
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "positives": pos,
        "negatives": int(np.sum(truth == 0)),
    }


def _at_fpr(
    scores: npt.NDArray[np.float64], ordinary: npt.NDArray[np.float64], fpr: float
) -> float:
    """The lowest threshold whose false-positive rate on ``ordinary`` is at most ``fpr``."""
    ranked = np.sort(ordinary)[::-1]
    allowed = int(np.floor(fpr * len(ranked)))
    return float(ranked[allowed]) + 1e-9 if allowed < len(ranked) else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-python", required=True)
    parser.add_argument("--artifacts", type=Path, default=Path("models/artifacts"))
    args = parser.parse_args(argv)

    rows = [r for r in load_rows().rows if _split_of(r.text) == "test" and not r.test_only]
    texts = [r.text for r in rows]
    ours, meta = heads_scores(args.artifacts, texts)
    theirs = baseline_scores(args.baseline_python, texts)
    thresholds = meta["thresholds"]
    index = {c: i for i, c in enumerate(meta["categories"])}
    ordinary = np.array([r.source == "fow" for r in rows])
    content = [
        c for c in CATEGORIES if c not in (PROMPT_INJECTION, MINORS) and c in meta["covered"]
    ]
    ours_any = np.max(
        np.stack([ours[:, index[c]] - thresholds[c] for c in content], axis=1), axis=1
    )  # >= 0: flagged
    figures: dict[str, Any] = {"heads_version": None, "test_texts": len(rows)}
    manifest = json.loads((args.artifacts / NAME / "manifest.json").read_text())
    figures["heads_version"] = manifest["version"]

    # harassment: the closest to what a profanity model is for
    harass_truth = np.array(
        [_role(r, "harassment") if _role(r, "harassment") is not None else -1 for r in rows]
    )
    keep = harass_truth >= 0
    h_ours = ours[:, index["harassment"]]
    fpr = float(np.mean(h_ours[ordinary] >= thresholds["harassment"]))
    matched = _at_fpr(theirs, theirs[ordinary], fpr)
    figures["harassment"] = {
        "heads_at_threshold": _rates(
            (h_ours >= thresholds["harassment"])[keep], harass_truth[keep]
        ),
        "alt_profanity_check_at_0.5": _rates((theirs >= 0.5)[keep], harass_truth[keep]),
        "alt_profanity_check_at_heads_ordinary_fpr": _rates(
            (theirs >= matched)[keep], harass_truth[keep]
        ),
        "ordinary_fpr_heads": round(fpr, 4),
    }
    # flagged: any content category against its profanity probability
    harmful = np.array(
        [1 if (r.labels - {PROMPT_INJECTION}) else (0 if r.benign else -1) for r in rows]
    )
    keep = harmful >= 0
    fpr_any = float(np.mean(ours_any[ordinary] >= 0))
    matched_any = _at_fpr(theirs, theirs[ordinary], fpr_any)
    figures["flagged_any"] = {
        "heads": _rates((ours_any >= 0)[keep], harmful[keep]),
        "alt_profanity_check_at_0.5": _rates((theirs >= 0.5)[keep], harmful[keep]),
        "alt_profanity_check_at_heads_ordinary_fpr": _rates(
            (theirs >= matched_any)[keep], harmful[keep]
        ),
        "ordinary_fpr_heads": round(fpr_any, 4),
    }
    gain = (figures["flagged_any"]["heads"]["recall"] or 0.0) - (
        figures["flagged_any"]["alt_profanity_check_at_heads_ordinary_fpr"]["recall"] or 0.0
    )
    targets = {
        "flagged_recall_gain_over_alt_profanity_check": target(
            round(gain, 4), ">= 0.30 at the same ordinary false-positive rate", gain >= 0.30
        )
    }
    path = write_results(RESULTS, figures, targets)
    print(json.dumps(figures, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
