"""Prompt-lookup speculation inside the continuous batcher, on the tiny model: the output
is the output without it, proposals are verified and rolled back, and stops, lengths,
resumed streams, grammars and the batch cap keep working.

How long the drafts are follows the position cost the engine measures from its own step
times (StepCost), which vary from run to run and machine to machine; except in the test of
that measuring, the cost is pinned to its prior here, so the same proposals are made on
every run. Which proposals the tiny random model takes depends on the CPU's rounding, so
the tests that need some taken and some refused count them over several passages."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from agent.engine.continuous_batcher import _Sequence
from agent.engine.interface import GenerationRequest, SamplingParams
from agent.engine.speculation import StepCost
from agent.engine.text_model import OnnxTextModel
from agent.structured import GrammarCompiler, parse_response_format
from tests.agent.test_batching import Recorder, make_model

SPECULATE = {"speculative_tokens": 6, "prefix_cache_bytes": 0}
PLAIN = {"speculative_tokens": 0, "prefix_cache_bytes": 0}
SEEDS = range(4)  # passages over which proposals taken and refused are counted


@pytest.fixture(autouse=True)
def prior_position_cost(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.name != "test_the_engine_measures_what_a_proposed_position_costs":
        monkeypatch.setattr(StepCost, "observe", lambda self, positions, seconds: None)


def repetitive_prompt(seed: int = 0) -> list[int]:
    """A random passage three times: the tiny model's greedy output copies parts of it."""
    passage = np.random.default_rng(seed).integers(100, 40000, size=30)
    return [int(t) for t in np.tile(passage, 3)]


async def generate(
    model: OnnxTextModel, prompt: list[int], params: SamplingParams, **extra: object
) -> tuple[list[int], str, str | None]:
    request = GenerationRequest("t", prompt, params, **extra)  # type: ignore[arg-type]
    outs = [o async for o in model.generate(request)]
    tokens = [t for o in outs for t in o.token_ids]
    return tokens, "".join(o.text for o in outs), outs[-1].finish_reason


async def both(
    artifacts: Path, prompt: list[int], params: SamplingParams, **extra: object
) -> tuple[tuple[list[int], str, str | None], tuple[list[int], str, str | None], Recorder]:
    """The output without speculation, with it, and what the speculative steps did."""
    plain = await make_model(artifacts, **PLAIN)
    expected = await generate(plain, prompt, params, **extra)
    await plain.close()
    model = await make_model(artifacts, **SPECULATE)
    spy = Recorder()
    model.add_listener(spy)
    got = await generate(model, prompt, params, **extra)
    await model.close()
    return expected, got, spy


def proposed(spy: Recorder) -> int:
    return sum(s.proposed_tokens for s in spy.steps)


def accepted(spy: Recorder) -> int:
    return sum(s.accepted_tokens for s in spy.steps)


async def test_greedy_output_is_unchanged_with_proposals_taken_and_refused(
    tiny_artifacts: Path,
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=60)
    taken = offered = 0
    for seed in SEEDS:
        expected, got, spy = await both(tiny_artifacts, repetitive_prompt(seed), params)
        assert got == expected, seed
        decode = [s for s in spy.steps if s.batch_size]
        assert sum(s.decoded_tokens for s in decode) == len(got[0]) - 1  # the first is prefill's
        assert len(decode) == len(got[0]) - 1 - accepted(spy), seed  # a step saved per token taken
        if proposed(spy):
            assert max(s.decode_positions for s in decode) > 1
        taken, offered = taken + accepted(spy), offered + proposed(spy)
    # proposals were verified, some taken (fewer steps than tokens), some refused (rolled back)
    assert 0 < taken < offered


async def test_seeded_output_is_unchanged(tiny_artifacts: Path) -> None:
    """The tiny random model's sampled output repeats nothing, so proposals come from a
    resumed stream whose delivered tokens start the passage again; the model refuses them
    (seeded acceptance is tested on the real model, test_speculation_real.py)."""
    for seed in (1, 2, 3):
        prompt = repetitive_prompt(seed)
        params = SamplingParams(temperature=0.7, seed=seed, max_tokens=30)
        expected, got, spy = await both(
            tiny_artifacts, prompt, params, continuation_token_ids=prompt[:4]
        )
        assert got == expected, seed
        assert proposed(spy) > 0, seed


async def test_stop_strings_max_tokens_and_min_tokens(tiny_artifacts: Path) -> None:
    prompt = repetitive_prompt()
    greedy = SamplingParams(temperature=0.0, max_tokens=60)
    _, (tokens, text, _), spy = await both(tiny_artifacts, prompt, greedy)
    # where the output came several tokens at once: the latest such step's tokens [at, end);
    # the stop string is the shortest (7 characters or more) end of the text up to there
    # that is not met before (accepted proposals copy earlier text, so it may reach back)
    ends = np.cumsum([1] + [s.decoded_tokens for s in spy.steps if s.batch_size])
    sizes = np.diff(ends)
    (multi,) = np.nonzero(sizes > 1)
    at, end = int(ends[multi[-1]]), int(ends[multi[-1] + 1])
    model = await make_model(tiny_artifacts, **PLAIN)
    before, upto = model.decode(tokens[:at]), model.decode(tokens[:end])
    await model.close()
    stop = next(upto[-n:] for n in range(7, len(upto)) if text.find(upto[-n:]) == len(upto) - n)
    assert text.find(stop) + len(stop) > len(before)  # ends in that step's tokens
    cases = [
        SamplingParams(temperature=0.0, max_tokens=60, stop=(stop,)),
        SamplingParams(temperature=0.0, max_tokens=at + 2),  # ends inside a proposal
        SamplingParams(temperature=0.0, max_tokens=at + 1),
        SamplingParams(temperature=0.0, max_tokens=60, min_tokens=60),
    ]
    for params in cases:
        expected, got, spy = await both(tiny_artifacts, prompt, params)
        assert got == expected, params
        assert accepted(spy) > 0, params
        if params.stop:
            assert got[2] == "stop" and got[1] == text[: text.find(stop)]
        elif params.max_tokens < 60:
            assert got[2] == "length" and len(got[0]) == params.max_tokens


async def test_a_resumed_stream_continues_as_the_uninterrupted_one(tiny_artifacts: Path) -> None:
    prompt = repetitive_prompt()
    for params in (
        SamplingParams(temperature=0.0, max_tokens=50),
        SamplingParams(temperature=0.7, seed=9, max_tokens=50),
    ):
        model = await make_model(tiny_artifacts, **SPECULATE)
        whole, _, _ = await generate(model, prompt, params)
        rest = dataclasses.replace(params, max_tokens=params.max_tokens - 17)
        resumed, _, _ = await generate(model, prompt, rest, continuation_token_ids=whole[:17])
        await model.close()
        assert whole[:17] + resumed == whole


async def test_no_proposals_in_a_batch_wider_than_the_cap(tiny_artifacts: Path) -> None:
    """Three resumed streams whose delivered tokens start their passage's repeat (so each
    has proposals at its first sampled step): two short ones while the third replays its
    30 tokens, then that one alone."""
    prompts = [repetitive_prompt(seed) for seed in (0, 1, 2)]
    model = await make_model(tiny_artifacts, **SPECULATE, speculative_max_batch=2)
    spy = Recorder()
    model.add_listener(spy)
    got = await asyncio.gather(*(
        generate(model, p, SamplingParams(temperature=0.0, max_tokens=n),
                 continuation_token_ids=p[:delivered])
        for p, n, delivered in zip(prompts, (20, 5, 5), (30, 4, 4), strict=True)
    ))  # fmt: skip
    await model.close()
    wide = [s for s in spy.steps if s.batch_size > 2]
    assert wide and all(s.proposed_tokens == 0 and s.decode_positions == s.batch_size
                        for s in wide)  # fmt: skip
    assert proposed(spy) > 0  # once it ran alone
    assert [len(g[0]) for g in got] == [20, 5, 5]


async def test_proposals_the_grammar_refuses_are_cut(tiny_artifacts: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_artifacts / "tiny-llama" / "tokenizer.json"))
    compiler = GrammarCompiler(tokenizer.to_str(), [2], tokenizer.get_vocab_size(True))
    spec = parse_response_format({"type": "json_object"})
    assert spec is not None
    grammar = compiler.compile_now(spec)
    compiler.close()
    inside = tokenizer.encode('{"a":1,"b":2,"c":3}', add_special_tokens=False).ids
    # the prompt holds the object; the output so far is its first two tokens: the lookup
    # proposes the rest, then what followed it in the prompt (not JSON: cut)
    tail = tokenizer.encode(" and then some words", add_special_tokens=False).ids
    prompt = [*inside, *tail]
    request = GenerationRequest("t", prompt, SamplingParams(max_tokens=50), constraint=grammar)
    wide = {**SPECULATE, "speculative_tokens": 20, "speculative_max_extra_positions": 20}
    model = await make_model(tiny_artifacts, **wide)
    seq = _Sequence(request, model._codec, frozenset([2]), 0, 60.0, 20)
    assert seq.constraint is not None
    seq.draft.rate = 1.0  # as after many proposals taken whole: the longest
    for token in inside[:2]:
        assert seq.constraint.advance(token)
    seq.history[len(prompt) : len(prompt) + 2] = inside[:2]
    seq.history_len += 2
    (proposal,) = model.engine._proposals([seq])
    await model.close()
    rest = inside[2:]
    assert proposal[: len(rest)] == rest  # the rest of the object, as in the prompt
    assert seq.constraint.accepts(proposal) == len(proposal)
    assert len(proposal) < len(rest) + len(tail)  # the words after it were cut


async def test_a_prompt_from_the_prefix_cache_speculates_as_a_fresh_one(
    tiny_artifacts: Path,
) -> None:
    """With the prefix cache on (as shipped), the second request of the same prompt starts
    from the cached prompt's keys and values and speculates: its output is the output of a
    fresh prompt without speculation, and the refused proposals of the first request (scratch
    past its row's length) did not reach the cached prefix."""
    params = SamplingParams(temperature=0.0, max_tokens=60)
    taken = offered = 0
    for seed in SEEDS:
        prompt = repetitive_prompt(seed)
        plain = await make_model(tiny_artifacts, **PLAIN)
        expected = await generate(plain, prompt, params)
        await plain.close()
        model = await make_model(tiny_artifacts, **{**SPECULATE, "prefix_cache_bytes": 8 << 20})
        spy = Recorder()
        model.add_listener(spy)
        first = await generate(model, prompt, params)
        assert not spy.reused
        steps = len(spy.steps)
        second = await generate(model, prompt, params)
        await model.close()
        assert spy.reused and spy.reused[-1] > 0  # the second prompt came from the cache
        assert first == expected and second == expected, seed
        later = spy.steps[steps:]
        taken += sum(s.accepted_tokens for s in later)
        offered += sum(s.proposed_tokens for s in later)
    assert offered > taken > 0


async def test_the_engine_measures_what_a_proposed_position_costs(tiny_artifacts: Path) -> None:
    """The draft lengths follow a position cost fitted from the engine's own steps of one
    sequence (steps with and without proposals), reported with each such step."""
    model = await make_model(tiny_artifacts, **SPECULATE)
    spy = Recorder()
    model.add_listener(spy)
    cost = model._engine._step_cost  # type: ignore[union-attr]
    assert cost._fit is None
    await generate(model, repetitive_prompt(), SamplingParams(temperature=0.0, max_tokens=60))
    await model.close()
    alone = [s for s in spy.steps if s.batch_size == 1 and not s.prefill_tokens]
    assert alone and all(s.position_cost > 0 for s in alone)
    assert {s.decode_positions for s in alone} > {1}  # steps with proposals among them
    assert cost._fit is not None  # fitted: the draft lengths use the measured cost
    assert alone[-1].position_cost == cost.position_cost
