"""The prompt-lookup proposer and the per-sequence draft length (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest

from agent.config import load_config
from agent.engine.interface import StepStats
from agent.engine.speculation import (
    POSITION_COST,
    DraftLength,
    Match,
    StepCost,
    best_length,
    lookup,
)
from agent.errors import ConfigError
from agent.metrics import AgentMetrics


def _ids(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def propose(
    context: np.ndarray, k: int, ngram_min: int, ngram_max: int, lookback: int
) -> np.ndarray:
    """What the batcher proposes: up to ``k`` tokens after the lookup's match (empty if none)."""
    found = lookup(context, ngram_min, ngram_max, lookback) if k > 0 else None
    return context[:0] if found is None else context[found.start : found.start + k]


def test_proposes_what_followed_the_last_ngram() -> None:
    context = _ids(1, 2, 3, 4, 5, 6, 9, 9, 2, 3)
    assert propose(context, 3, 2, 4, 100).tolist() == [4, 5, 6]
    assert propose(context, 10, 2, 4, 100).tolist() == [4, 5, 6, 9, 9, 2, 3]


def test_longest_match_wins_then_the_most_recent() -> None:
    # "2 3" occurs twice before the end: after "7 2 3" comes 8, after "1 2 3" comes 4; the
    # context ends "1 2 3", so the three-token match (followed by 4) wins over the later
    # two-token one (followed by 8)
    context = _ids(1, 2, 3, 4, 7, 2, 3, 8, 5, 1, 2, 3)
    assert propose(context, 2, 2, 4, 100).tolist() == [4, 7]
    # of equally long matches the most recent
    context = _ids(5, 6, 1, 5, 6, 2, 0, 5, 6)
    assert propose(context, 1, 2, 4, 100).tolist() == [2]


def test_no_proposal_below_ngram_min_or_beyond_lookback() -> None:
    context = _ids(1, 2, 3, 4, 9, 3)  # only "3" repeats: a 1-gram
    assert propose(context, 3, 2, 4, 100).size == 0
    assert propose(context, 3, 1, 4, 100).tolist() == [4, 9, 3]
    context = _ids(1, 2, 3, 4, *range(10, 30), 1, 2, 3)
    assert propose(context, 2, 2, 4, 100).tolist() == [4, 10]
    assert propose(context, 2, 2, 4, 10).size == 0  # the earlier "1 2 3" is out of reach
    assert propose(context, 0, 2, 4, 100).size == 0
    assert propose(_ids(7), 3, 1, 4, 100).size == 0


def test_ngram_max_bounds_the_match_not_the_proposal() -> None:
    # with ngram_max 2 the 3-gram "1 2 3" is not looked for: the latest "2 3" wins
    context = _ids(1, 2, 3, 4, 7, 2, 3, 8, 5, 1, 2, 3)
    assert propose(context, 2, 2, 2, 100).tolist() == [8, 5]


def test_matches_a_brute_force_search() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        context = rng.integers(0, 4, size=int(rng.integers(2, 40))).astype(np.int64)
        lo, hi, look, k = 1 + int(rng.integers(0, 2)), 2 + int(rng.integers(0, 3)), 30, 3
        window = context[-look:].tolist()
        expected: list[int] = []
        for n in range(hi, lo - 1, -1):
            if n >= len(window):
                continue
            suffix = window[-n:]
            hits = [i for i in range(len(window) - n) if window[i : i + n] == suffix]
            if hits:
                at = hits[-1] + n
                expected = window[at : at + k]
                break
        assert propose(context, k, lo, hi, look).tolist() == expected, context.tolist()


def test_best_length_follows_the_acceptance_rate() -> None:
    # expected tokens per unit of step time, each position costing 0.15 of a step
    assert best_length(0.95, 6) == 6
    assert best_length(0.6, 6) == 2
    assert best_length(0.3, 6) == 1
    assert best_length(0.15, 6) == 0  # 1.15 tokens for 1.15 steps: nothing gained
    assert best_length(0.9, 3) == 3  # never past the maximum
    assert best_length(0.3, 6, position_cost=0.05) == 2  # cheaper positions: longer
    # a likely first token and a run that goes on once started: long
    assert best_length(0.9, 6, first=0.6) == 6
    # an unlikely first token: nothing pays however the run would go on
    assert best_length(0.95, 6, first=0.1) == 0
    assert best_length(0.6, 6, first=0.6) == best_length(0.6, 6)  # the same when equal


def test_lookup_says_where_and_how_long() -> None:
    context = _ids(1, 2, 3, 4, 7, 2, 3, 8, 5, 1, 2, 3)
    assert lookup(context, 2, 4, 100) == Match(start=3, length=3)
    assert lookup(context, 2, 2, 100) == Match(start=7, length=2)
    assert lookup(context, 4, 4, 100) is None
    # the index is into the whole context, not the lookback window
    context = _ids(*range(10, 30), 1, 2, 3, 4, 5, 1, 2, 3)
    assert lookup(context, 2, 4, 10) == Match(start=23, length=3)
    # ngram_max 8 tells two sources apart that 4 tokens do not: the one being copied wins
    context = _ids(1, 2, 3, 4, 5, 6, 9, 0, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5, 6)
    assert propose(context, 1, 2, 8, 100).tolist() == [9]
    assert propose(context, 1, 2, 4, 100).tolist() == [8]


def test_draft_length_grows_with_the_match_and_with_runs_taken() -> None:
    draft = DraftLength(max_tokens=6)
    # before anything was verified: more after a long match than after a short one
    assert (draft.wanted(1), draft.wanted(2), draft.wanted(4)) == (1, 3, 3)
    assert draft.wanted(3) == 3 and draft.wanted(8) == draft.wanted(4)
    for _ in range(5):
        k = draft.wanted(4)
        draft.update(k, k)  # taken whole: longer
    assert draft.wanted(4) == 6
    # 2-token matches whose first token is refused stop proposing (then probe); 4-token
    # matches keep their own estimate
    for _ in range(10):
        if (k := draft.wanted(2)) == 0:
            break
        draft.update(k, 0)
    assert draft.wanted(2) == 0 and draft.wanted(4) == 6
    # a first token taken and the next refused: the run estimate falls, not the first's
    first, rate = draft.first[3], draft.rate
    draft.wanted(4)
    draft.update(6, 1)
    assert draft.first[3] > first and draft.rate < rate


def test_draft_length_adapts_and_probes_when_nothing_pays() -> None:
    draft = DraftLength(max_tokens=6)
    for _ in range(5):
        draft.update(draft.wanted(), draft.wanted())  # taken whole: longer
    assert draft.wanted() == 6
    lengths = []
    for _ in range(20):
        if (k := draft.wanted()) == 0:
            break
        lengths.append(k)
        draft.update(k, 0)  # refused at once: shorter, then nothing
    assert lengths == sorted(lengths, reverse=True) and draft.first[3] <= 0.2
    # nothing proposed for PAUSE lookups (the loop's last call was the first), then a probe
    pause = DraftLength.PAUSE - 1
    assert [draft.wanted() for _ in range(pause)] == [0] * pause
    assert draft.wanted() == 1
    draft.update(1, 1)  # the probe was taken: proposing again (runs went on before)
    k = draft.wanted()
    assert k > 0
    draft.update(0, 0)  # nothing proposed: nothing learned
    assert draft.wanted() == k


def test_config_turns_it_on_and_refuses_an_empty_ngram_range() -> None:
    on = load_config(environ={"EDGEFLEET_AGENT_ENGINE__SPECULATIVE_TOKENS": "5"})
    assert on.engine.batcher().speculative_tokens == 5
    assert load_config(environ={}).engine.batcher().speculative_tokens == 0  # off by default
    with pytest.raises(ConfigError, match="speculative_ngram_min"):
        load_config(environ={}, overrides={"engine": {"speculative_ngram_min": 9}})


def test_metrics_count_proposals_and_tokens_per_step() -> None:
    metrics = AgentMetrics()
    metrics.on_step(StepStats(batch_size=2, decoded_tokens=6, proposed_tokens=5, accepted_tokens=4))
    metrics.on_step(StepStats(batch_size=1, decoded_tokens=1))
    metrics.on_step(StepStats(prefill_tokens=30))  # a prefill-only step decodes nothing
    text = generate_latest(metrics.registry).decode()
    assert "edgefleet_agent_speculative_proposed_tokens_total 5.0" in text
    assert "edgefleet_agent_speculative_accepted_tokens_total 4.0" in text
    assert "edgefleet_agent_decode_tokens_per_step_sum 4.0" in text  # 6 / 2 + 1 / 1
    assert "edgefleet_agent_decode_tokens_per_step_count 2.0" in text
    assert "edgefleet_agent_speculative_position_cost 0.0" in text  # not measured yet
    metrics.on_step(StepStats(batch_size=1, decoded_tokens=3, position_cost=0.25))
    text = generate_latest(metrics.registry).decode()
    assert "edgefleet_agent_speculative_position_cost 0.25" in text


def steps(cost: StepCost, ms: float, per_position_ms: float, n: int) -> None:
    """``n`` steps of one sequence, their positions cycling 1, 7, 1, 3, 1, 5."""
    for i in range(n):
        positions = (1, 7, 1, 3, 1, 5)[i % 6]
        cost.observe(positions, (ms + per_position_ms * (positions - 1)) / 1000)


def test_step_cost_is_measured_from_the_steps_and_follows_them() -> None:
    cost = StepCost()
    assert cost.position_cost == POSITION_COST  # nothing measured: the prior
    for _ in range(50):
        cost.observe(1, 0.010)
    assert cost.position_cost == POSITION_COST  # one-position steps only: nothing to fit
    steps(cost, 10, 4, 120)  # each further position 4 ms of a 10-ms step (an AVX2 box)
    assert cost.position_cost == pytest.approx(0.4, abs=0.01)
    steps(cost, 10, 1, 240)  # the machine (or the context) changed: 1 ms each
    assert cost.position_cost == pytest.approx(0.1, abs=0.01)
    cost.observe(7, 2.0)  # a 2-s pause of the process: counted as 2x the fit's prediction
    assert cost.position_cost < 0.2
    steps(cost, 10, 1, 120)
    assert cost.position_cost == pytest.approx(0.1, abs=0.01)


def test_a_dearer_position_proposes_fewer_tokens() -> None:
    cheap, dear = StepCost(), StepCost()
    steps(cheap, 10, 1, 120)
    steps(dear, 10, 4, 120)
    lengths = [DraftLength(6, c) for c in (None, cheap, dear)]
    for draft in lengths:
        draft.rate = 0.7
    unmeasured, on_cheap, on_dear = (d.wanted(4) for d in lengths)
    assert on_cheap > unmeasured > on_dear > 0  # 0.1, 0.15 and 0.4 of a step per position
    assert on_dear == best_length(0.7, 6, 0.4, first=DraftLength.START_FIRST[3])
