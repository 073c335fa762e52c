"""models/ort_llm's perplexity sum, taken a few rows of logits at a time (the whole block in
float64 was 970 MB for Qwen2.5's vocabulary over the gate's text)."""

from __future__ import annotations

import numpy as np

from models.ort_llm import NLL_ROWS, _nll_sum


def whole_block(logits: np.ndarray, targets: np.ndarray) -> float:
    wide = logits.astype(np.float64)
    peak = wide.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(wide - peak).sum(axis=-1)) + peak[:, 0]
    return float((log_norm - wide[np.arange(len(targets)), targets]).sum())


def test_the_sum_by_rows_is_the_sum_of_the_whole_block() -> None:
    rng = np.random.default_rng(7)
    for rows in (1, NLL_ROWS - 1, NLL_ROWS, NLL_ROWS + 1, 3 * NLL_ROWS + 5):
        logits = (rng.standard_normal((rows, 1000)) * 8).astype(np.float32)
        targets = rng.integers(0, 1000, rows)
        assert np.isclose(_nll_sum(logits, targets), whole_block(logits, targets), rtol=1e-12)


def test_each_row_is_scored_against_its_own_target() -> None:
    """One row certain of its token, the next certain of another: the sum is near 0 only
    when every row is read with its own target (across a block boundary too)."""
    rows = NLL_ROWS + 2
    targets = np.arange(rows) % 50
    logits = np.full((rows, 50), -30.0, np.float32)
    logits[np.arange(rows), targets] = 30.0
    assert _nll_sum(logits, targets) < 1e-6
    assert _nll_sum(logits, np.roll(targets, 1)) > 50 * rows
