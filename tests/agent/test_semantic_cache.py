"""The semantic cache: isolation per context, the threshold, the lexical guard, the byte
budget in LRU order, expiry, what is never stored; and with the real int8 MiniLM, that a
reworded repeat hits and a prompt differing in a number does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.engine.embedder import OnnxEmbeddingModel
from agent.engine.ort_session import SessionConfig
from agent.model_loader import load_registry
from agent.response_cache import CachedGeneration
from agent.semantic_cache import (
    SemanticCache,
    calibrated_misspelt_threshold,
    calibrated_threshold,
    semantic_context,
)
from agent.semantic_guard import misspelt_repeat, refusal, signature, time_sensitive

DIM = 8


def unit(*values: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


def answer(text: str, finish: str = "stop") -> CachedGeneration:
    return CachedGeneration(text, (1, 2, 3), finish, 10, 3)


def context(key: str = "key-a", version: str = "v1", **over: Any) -> bytes:
    args: dict[str, object] = {
        "api_key_id": key,
        "model_id": "smollm2",
        "model_version": version,
        "endpoint": "chat",
        "fields": {"params": {"temperature": 0.0, "max_tokens": 64}, "constraint": None},
        "earlier": [{"role": "system", "content": "You are terse."}],
        "embedder_version": "int8-1",
        "moderation_version": "heads-1",
    }
    args.update(over)
    return semantic_context(**args)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cache(**kw: object) -> SemanticCache:
    args: dict[str, object] = {"threshold": 0.9, "max_bytes": 1 << 20, "ttl_s": 60.0}
    args.update(kw)
    return SemanticCache(**args)  # type: ignore[arg-type]


PROMPT = "How do I reset my password?"
REWORDED = "How do I reset my password please?"


def test_a_close_prompt_in_the_same_context_hits_with_its_similarity() -> None:
    c = cache()
    assert c.put(context(), PROMPT, unit(1, 0.1), answer("Use the reset link."))
    found = c.lookup(context(), REWORDED, unit(1, 0.12))
    assert found.outcome == "hit"
    assert found.entry is not None and found.entry.text == "Use the reset link."
    assert found.similarity > 0.99
    # below the threshold: a miss that reports how close it came
    far = c.lookup(context(), REWORDED, unit(1, 1))
    assert far.outcome == "miss" and 0 < far.similarity < 0.9


@pytest.mark.parametrize(
    "other",
    [
        {"key": "key-b"},  # another API key
        {"version": "v2"},  # a new model version
        {"model_id": "qwen"},
        {"endpoint": "completions"},
        {"fields": {"params": {"temperature": 0.0, "max_tokens": 65}, "constraint": None}},
        {"fields": {"params": {"temperature": 0.0, "max_tokens": 64}, "constraint": "json"}},
        {"earlier": [{"role": "system", "content": "You are verbose."}]},
        {"earlier": []},
        {"embedder_version": "int8-2"},
        {"moderation_version": "heads-2"},
    ],
)
def test_any_other_context_never_gets_the_entry(other: dict[str, Any]) -> None:
    c = cache()
    c.put(context(), PROMPT, unit(1), answer("key A's answer"))
    found = c.lookup(context(**other), PROMPT, unit(1))  # the very same prompt and vector
    assert found.outcome == "miss" and found.entry is None
    assert c.lookup(context(), PROMPT, unit(1)).outcome == "hit"


def test_a_prompt_differing_only_in_a_number_is_refused_by_the_guard() -> None:
    c = cache()
    c.put(context(), "Track order 48213", unit(1), answer("Out for delivery."))
    found = c.lookup(context(), "Track order 48231", unit(1))  # identical vectors
    assert found.outcome == "refused" and found.reason == "number" and found.entry is None


@pytest.mark.parametrize(
    ("cached", "asked", "reason"),
    [
        ("Do you have a table for 2?", "Do you have a table for two?", None),
        ("Do you have a table for 2?", "Do you have a table for twelve?", "number"),
        ("What's 15% of 200?", "What's 50% of 200?", "number"),
        ("Are you open on Saturday?", "Are you open on Sunday?", "date"),
        ("Is the 9:15 train on time?", "Is the 9:45 train on time?", "date"),
        ("Cancel my subscription", "Don't cancel my subscription", "negation"),
        ("Which plans include calls?", "Which plans do not include calls?", "negation"),
        ("How do I turn on dark mode?", "How do I turn off dark mode?", "antonym"),
        ("How do I enable dark mode?", "How do I disable dark mode?", "antonym"),
        ("Is ibuprofen safe with alcohol?", "Is ibuprofen unsafe with alcohol?", "antonym"),
        ("How do I export data from Salesforce?", "How do I export data from HubSpot?", "entity"),
        ("Convert a Word file to PDF", "Convert a PDF file to Word", "entity"),
        ("What's the drinking age in the UK?", "what's the drinking age in the uk", None),
        ("Move money from savings to checking", "Move money from checking to savings", "direction"),
        ("Summarize https://a.example.com/x", "Summarize https://b.example.com/x", "url"),
        ("What does parse_args return?", "What does parse_known_args return?", "code"),
        ("What does getUserName do?", "What does getUserId do?", "code"),
        ("What vaccines does my puppy need?", "What vaccines does my kitten need?", "swap"),
        ("What are the symptoms of flu?", "What are the symptoms of flu in babies?", "qualifier"),
        ("How do I reset my password?", "How do I reset my colleague's password?", "entity"),
        ("How do I change my email address?", "How do I chnage my email adress?", None),
        ("I can't log in to my bank, what now?", "I cannot log in to my bank, what now?", None),
        ("How do I get my child's results?", "so how do i get my childs results", None),
        ("Is the pad thai spicy?", "Is the green curry spicy?", "swap"),
        ("How do I change my email address?", "Hi, how do I change my email address? Thanks", None),
        # synonyms and light verbs are a rewording; other content words are not
        ("How do I cancel my gym membership?", "How do I end my gym membership?", None),
        ("Where is the nearest shop?", "Where is the nearest store?", None),
        ("How do I set up a direct debit?", "How do I create a direct debit?", None),
        ("When will I receive my refund?", "When will I get my refund?", None),
        ("Do you offer gift wrapping?", "Do you do gift wrapping?", None),
        ("How long is the waiting list?", "How long is the wait list?", None),
        ("How do I cancel my order?", "How do I change my order?", "swap"),
        ("How do I cancel my order?", "How do I cancel my subscription?", "qualifier"),
        ("Is the chicken dish gluten-free?", "Is the beef dish gluten-free?", "swap"),
    ],
)
def test_the_guard(cached: str, asked: str, reason: str | None) -> None:
    assert refusal(signature(cached), signature(asked)) == reason
    assert refusal(signature(asked), signature(cached)) == reason  # either way round


@pytest.mark.parametrize(
    ("cached", "asked", "reason"),
    [
        # a number is compared as its value and its unit, however written
        ("What's 15% of 200?", "What's fifteen percent of 200?", None),
        ("What's 15% of 200?", "What's 15 % of 200?", None),
        ("How long do I roast a 2kg chicken?", "How long do I roast a 2 kilo chicken?", None),
        ("How long do I roast a 2kg chicken?", "How long do I roast a two kilo chicken?", None),
        ("How long do I roast a 2kg chicken?", "How long do I roast a 3 kilo chicken?", "number"),
        ("Is the 10GB plan unlimited?", "Is the 10MB plan unlimited?", "number"),
        ("What's the rate on a 2-year fix?", "What's the rate on a two-year fix?", None),
        ("What's the rate on a 2-year fix?", "What's the rate on a three-year fix?", "number"),
        ("Who finished 1st in the race?", "Who finished first in the race?", None),
        ("How many calories are in one egg?", "How many calories are in a single egg?", None),
        # "am" and "pm" are a time after a number only
        ("Remind me at 7pm", "Remind me at 7 pm", None),
        ("Remind me at 7pm", "Remind me at 8 pm", "date"),
        ("How much luggage am I allowed?", "How much luggage is allowed?", None),
        # a misspelt weekday is that weekday, capitalised or not; another weekday is not
        ("Is the centre open on Mondays?", "Is the center open on Mondys?", None),
        ("Is the centre open on Mondays?", "Is the centre open on mondys?", None),
        ("Is the centre open on Mondays?", "Is the centre open on Sundays?", "date"),
        (
            "How do I pay more into my pension monthly?",
            "How do I pay more into my pension each month?",
            "date",
        ),
        # "to" before a verb is not the opposite of "from"; a source that becomes a
        # destination is
        (
            "How do I export my data from HubSpot?",
            "What's the way to export all my HubSpot data?",
            None,
        ),
        ("How do I move money to my savings?", "How do I move money from my savings?", "direction"),
        (
            "How do I increase my pension contributions?",
            "How do I pay less into my pension?",
            "antonym",
        ),
        # apologies and hedges ask nothing
        (
            "How do I bleed a radiator?",
            "Sorry, silly question, but how do I bleed a radiator?",
            None,
        ),
        (
            "How long does it take to get my deposit back?",
            "How long does it usually take to get my deposit back?",
            None,
        ),
        # "stay" and "remain" are "be" there ("is it open" asks what "does it stay open" asks)
        ("How long is the pool open?", "How long does the pool stay open?", None),
        ("Is the shop open late?", "Does the shop remain open late?", None),
        ("Where can I stay in Paris?", "Where can I eat in Paris?", "qualifier"),
        # a word and its derived form are one word; another word is not
        ("What causes a rainbow to form?", "What causes the formation of a rainbow?", None),
        ("Can I get a quote for a kitchen?", "Can I get a quotation for a kitchen?", None),
        ("Can I get a quote for a kitchen?", "Can I get a refund for a kitchen?", "swap"),
        # "wireless" and "process" are not plurals (a stem of "wireles" derives nothing)
        (
            "Does the Pixel support wireless charging?",
            "Does the Pixel support charging wirelessly?",
            None,
        ),
        # "non-members" is negated, and members
        ("What's the price for non-members?", "What's the price if you're not a member?", None),
        ("What's the price for non-members?", "What's the price for members?", "negation"),
    ],
)
def test_the_guard_compares_what_a_prompt_means_not_how_it_is_written(
    cached: str, asked: str, reason: str | None
) -> None:
    assert refusal(signature(cached), signature(asked)) == reason
    assert refusal(signature(asked), signature(cached)) == reason  # either way round


def test_living_somewhere_and_the_askers_own_current_deal_are_not_times() -> None:
    assert not time_sensitive("I live on my own, how do I claim the discount?")
    assert not time_sensitive("When will my broadband go live?")
    assert not time_sensitive("My current mortgage deal is ending, how do I switch?")
    assert time_sensitive("Where can I watch live scores?")
    assert time_sensitive("What's the current exchange rate?")


def test_a_misspelt_repeat_hits_below_the_threshold_and_nothing_else_does() -> None:
    prompt = "How do I change the email address on my account?"
    misspelt = "How do I chnage the email adress on my acount?"
    assert misspelt_repeat(signature(prompt), signature(misspelt))
    assert misspelt_repeat(
        signature(prompt), signature("so how do I chnage the email adress on my acount")
    )
    assert not misspelt_repeat(signature(prompt), signature(prompt))  # the same: the threshold's
    assert not misspelt_repeat(signature(prompt), signature("How can I update my email address?"))
    assert not misspelt_repeat(signature(prompt), signature("How do I change the email address?"))
    # what the guard would refuse is no misspelling either: numbers, opposites, prefixes
    for cached, asked in [
        ("Track order 48213", "Track order 48231"),
        ("How do I increase the font size?", "How do I decrease the font size?"),
        ("How do I lock my card?", "How do I unlock my card?"),
    ]:
        assert not misspelt_repeat(signature(cached), signature(asked))
    c = cache(threshold=0.9)
    c.put(context(), prompt, unit(1, 0), answer("Settings, then Email."))
    c.put(context(), "Track order 48213", unit(0, 0, 1), answer("Out for delivery."))
    low = unit(1, 1.2)  # cosine 0.64 with the entry
    assert c.lookup(context(), misspelt, low).outcome == "miss"  # no tier: below the threshold
    found = c.lookup(context(), misspelt, low, misspelt_threshold=0.6)
    assert found.outcome == "hit" and found.entry is not None
    assert 0.6 < found.similarity < 0.9
    reworded = c.lookup(
        context(), "How can I update my email address?", low, misspelt_threshold=0.6
    )
    assert reworded.outcome == "miss"
    assert c.lookup(context(), misspelt, unit(1, 1.4), misspelt_threshold=0.6).outcome == "miss"
    # the guard still reads a misspelt repeat: another weekday is another day
    c.put(context(), "Is the centre open on Mondays?", unit(0, 0, 0, 1), answer("Yes."))
    sunday = c.lookup(
        context(), "Is the centr open on Sundays?", unit(0, 0, 1.2, 1), misspelt_threshold=0.6
    )
    assert sunday.outcome == "refused" and sunday.reason == "date"
    # and a number is never a misspelling of another
    assert (
        c.lookup(context(), "Trak order 48231", unit(0, 1.2, 1), misspelt_threshold=0.6).outcome
        == "miss"
    )


@pytest.mark.parametrize(
    "prompt",
    ["What's the weather today?", "Latest news on the election", "What time is it now?"],
)
def test_time_sensitive_prompts_are_neither_stored_nor_answered(prompt: str) -> None:
    assert not time_sensitive("Can I open a current account online?")  # a kind of account
    assert time_sensitive(prompt)
    c = cache()
    assert not c.put(context(), prompt, unit(1), answer("sunny"))
    assert len(c) == 0
    c.put(context(), "What's the weather like?", unit(1), answer("It depends."))
    found = c.lookup(context(), prompt, unit(1))
    assert found.outcome == "ineligible" and found.reason == "time_sensitive"


def test_content_filter_results_and_overlong_prompts_are_not_stored() -> None:
    c = cache(max_prompt_chars=100)
    assert not c.put(context(), PROMPT, unit(1), answer("", finish="content_filter"))
    assert not c.put(context(), "x " * 60, unit(1), answer("long"))
    assert len(c) == 0 and c.bytes_used == 0
    assert c.lookup(context(), "x " * 60, unit(1)).reason == "too_long"


def test_entries_expire() -> None:
    clock = Clock()
    c = cache(ttl_s=30.0, clock=clock)
    c.put(context(), PROMPT, unit(1), answer("a"))
    clock.now += 29.9
    assert c.lookup(context(), PROMPT, unit(1)).outcome == "hit"
    clock.now += 0.2
    assert c.lookup(context(), PROMPT, unit(1)).outcome == "miss"
    assert len(c) == 0 and c.bytes_used == 0  # the expired entry is gone


def test_the_byte_budget_evicts_the_least_recently_used() -> None:
    probe = cache()  # one entry's size, measured in a throwaway cache
    probe.put(context(), "Question about limes", unit(1, 0), answer("x" * 100))
    size = probe.bytes_used
    c = cache(max_bytes=3 * size + 10)
    prompts = ["Question about apples", "Question about pears", "Question about plums"]
    for i, p in enumerate(prompts):
        assert c.put(context(), p, unit(*([0.0] * i), 1.0), answer("x" * 100))
    assert len(c) == 3
    # touching the first makes the second the least recently used
    assert c.lookup(context(), prompts[0], unit(1.0)).outcome == "hit"
    c.put(context(), "Question about figs", unit(0, 0, 0, 1), answer("x" * 100))
    assert len(c) == 3 and c.bytes_used <= c.max_bytes
    assert c.lookup(context(), prompts[1], unit(0, 1)).outcome == "miss"
    assert c.lookup(context(), prompts[0], unit(1.0)).outcome == "hit"
    assert c.lookup(context(), prompts[2], unit(0, 0, 1)).outcome == "hit"
    # an entry larger than the whole budget is not kept
    assert not c.put(context(), "Question huge", unit(1), answer("y" * 10_000))


def test_the_same_prompt_again_replaces_its_answer() -> None:
    c = cache()
    c.put(context(), PROMPT, unit(1), answer("old"))
    c.put(context(), PROMPT, unit(1), answer("new"))
    assert len(c) == 1
    found = c.lookup(context(), PROMPT, unit(1))
    assert found.entry is not None and found.entry.text == "new"


async def test_with_the_real_minilm_a_rewording_hits_and_a_number_change_does_not(
    real_artifacts: Path,
) -> None:
    registry = load_registry(
        real_artifacts,
        ["all-minilm-l6-v2"],
        session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
    )
    model = registry.embedding_models["all-minilm-l6-v2"]
    assert isinstance(model, OnnxEmbeddingModel)
    await model.start()
    try:
        texts = [
            "How do I change the email address on my account?",
            "How do I chnage the email adress on my account?",
            "Track order 48213 please",
            "Track order 48231 please",
        ]
        vectors = [np.asarray((await model.embed([t])).vectors[0], np.float32) for t in texts]
    finally:
        await model.close()
    c = cache(threshold=0.8)
    ctx = context(embedder_version=model.version)
    c.put(ctx, texts[0], vectors[0], answer("Settings, then Email."))
    c.put(ctx, texts[2], vectors[2], answer("Order 48213 is out for delivery."))
    assert c.lookup(ctx, texts[1], vectors[1]).outcome == "hit"
    wrong = c.lookup(ctx, texts[3], vectors[3])
    assert wrong.similarity > 0.9  # the embedding alone would have served it
    assert wrong.outcome == "refused" and wrong.reason == "number"


def test_the_calibrated_threshold_is_for_one_embedding_version_only(tmp_path: Path) -> None:
    table = tmp_path / "thresholds.json"
    table.write_text('{"all-minilm-l6-v2": {"version": "int8-1", "threshold": 0.8}}')
    assert calibrated_threshold("all-minilm-l6-v2", "int8-1", table) == 0.8
    assert calibrated_threshold("all-minilm-l6-v2", "int8-2", table) is None  # re-quantized
    assert calibrated_threshold("other", "int8-1", table) is None
    table.write_text('{"all-minilm-l6-v2": {"version": "int8-1", "threshold": 1.5}}')
    assert calibrated_threshold("all-minilm-l6-v2", "int8-1", table) is None
    assert calibrated_threshold("all-minilm-l6-v2", "int8-1", tmp_path / "none.json") is None
    table.write_text(
        '{"all-minilm-l6-v2": {"version": "int8-1", "threshold": 0.8, "misspelt_threshold": 0.6}}'
    )
    assert calibrated_misspelt_threshold("all-minilm-l6-v2", "int8-1", table) == 0.6
    assert calibrated_misspelt_threshold("all-minilm-l6-v2", "int8-2", table) is None
    table.write_text('{"all-minilm-l6-v2": {"version": "int8-1", "threshold": 0.8}}')
    assert calibrated_misspelt_threshold("all-minilm-l6-v2", "int8-1", table) is None


def test_the_guard_reads_only_the_most_similar_candidates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agent.semantic_cache as module
    import agent.semantic_guard as guard

    c = cache(max_candidates=3)
    for n in range(20):  # 20 near-duplicates, all above the threshold, all refused
        c.put(context(), f"Track order {n}", unit(1, 0.001 * n), answer(f"order {n}"))
    calls = []
    real = guard.refusal

    def counting(cached: object, asked: object) -> str | None:
        calls.append(1)
        return real(cached, asked)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "refusal", counting)
    found = c.lookup(context(), "Track order 99", unit(1, 0.0))
    assert found.outcome == "refused" and found.reason == "number"
    assert len(calls) == 3
    hit = c.lookup(context(), "Track order 0", unit(1, 0.0))  # the most similar one
    assert hit.outcome == "hit" and hit.entry is not None and hit.entry.text == "order 0"


@pytest.mark.parametrize("unit", ["a.", "a-", "-a", "a.-", "1.", "A.b "])
def test_the_guard_reads_a_long_message_in_time_that_grows_with_its_length(unit: str) -> None:
    """A hostile message of repeated dots or dashes (up to the 2,000 characters a message
    may have) costs the guard time in proportion to its length, not its square: the URL
    pattern used to retry from every dot (50-90 ms for 2,000 characters, on the event
    loop). Four times the text: well under the 16 times a quadratic search takes. Timed in
    the thread's own CPU time, the best of several tries: wall time counts the moments other
    processes had the core (CI saw 1.1 ms against 11 ms of wall time with a linear guard)."""
    import time

    from agent.semantic_guard import signature

    def seconds(text: str) -> float:
        best = float("inf")
        for _ in range(9):
            started = time.thread_time()
            signature(text)
            best = min(best, time.thread_time() - started)
        return best

    short, long = seconds(unit * 250), seconds(unit * 1000)
    assert long < 9 * short, (short, long)
