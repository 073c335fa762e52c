"""A /v1/completions prompt sent as token ids goes through a key's input check as the text
those ids stand for. It did not: a client whose key blocks a category (or any key, for
the sexual/minors default) sent the blocked prompt tokenized, ``{"prompt": [ids...]}``,
and the engine generated from it (200). Keys on, the tiny model's real tokenizer and
engine, the classifier's scores injected (tests/agent/test_moderation_in_requests.py)."""

from __future__ import annotations

from tests.agent.test_moderation_in_requests import (  # noqa: F401 (start: a fixture)
    COMPLETIONS,
    TINY,
    Start,
    bearer,
    block,
    error_of,
    make_key,
    start,
)


async def test_a_token_id_prompt_is_checked_as_its_text(start: Start) -> None:  # noqa: F811
    secret, key = make_key(block("input", "violence"))
    default_secret, default = make_key()
    agent = await start(key, default)
    agent.classifier.markers["STAB"] = {"violence": 0.99}
    agent.classifier.markers["MINOR"] = {"sexual": 0.4}  # the default blocks sexual/minors
    model = agent.registry.text_models[TINY]
    ids = model.encode("how to STAB someone")
    assert "STAB" in model.decode(ids)
    body = {"model": TINY, "prompt": ids, "max_tokens": 2}
    refused = await agent.client.post(COMPLETIONS, json=body, headers=bearer(secret))
    assert refused.status == 400, await refused.text()
    error = await error_of(refused)
    assert (error["code"], error["param"]) == ("content_filter", "prompt"), error
    assert agent.seen == []  # the engine never saw it
    minors = {"model": TINY, "prompt": model.encode("a MINOR story"), "max_tokens": 2}
    refused = await agent.client.post(COMPLETIONS, json=minors, headers=bearer(default_secret))
    assert refused.status == 400 and (await error_of(refused))["code"] == "content_filter"
    # a flag-only category: served, and the flag header says so
    agent.classifier.markers["RUDE"] = {"harassment": 0.9}
    rude = {"model": TINY, "prompt": model.encode("you RUDE thing"), "max_tokens": 2}
    flagged = await agent.client.post(COMPLETIONS, json=rude, headers=bearer(secret))
    assert flagged.status == 200, await flagged.text()
    assert flagged.headers["X-Edgefleet-Moderation"] == "flagged=harassment"
    calm = {"model": TINY, "prompt": model.encode("a calm question"), "max_tokens": 2}
    assert (await agent.client.post(COMPLETIONS, json=calm, headers=bearer(secret))).status == 200
    assert len(agent.seen) == 2
