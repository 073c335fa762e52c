"""The vault's placeholders, restoring, and restoring a stream split anywhere."""

from __future__ import annotations

import random

import pytest

from agent.redaction import Redactor, Vault
from agent.redaction.vault import PLACEHOLDER

R = Redactor()
TEXT = (
    "Hi, I'm Sarah Connor (sarah.connor@example.com, +1 415 555 0132). Card 4111 1111 1111 "
    "1111; write to sarah.connor@example.com again; server 10.1.2.3."
)


def test_same_value_same_placeholder_and_counts_by_type() -> None:
    vault = Vault()
    out = R.redact(TEXT, vault)
    assert out.count("<EMAIL_1>") == 2 and "<EMAIL_2>" not in out
    for value in ("Sarah Connor", "sarah.connor@example.com", "415 555", "4111", "10.1.2.3"):
        assert value not in out
    assert vault.counts == {"PERSON": 1, "EMAIL": 2, "PHONE": 1, "CREDIT_CARD": 1, "IP_ADDRESS": 1}
    assert vault.restore(out) == TEXT


def test_placeholders_are_shared_across_texts_of_one_request() -> None:
    vault = Vault()
    a = R.redact("from bob@example.org", vault)
    b = R.redact("reply to bob@example.org or eve@example.org", vault)
    assert a == "from <EMAIL_1>" and b == "reply to <EMAIL_1> or <EMAIL_2>"


def test_restore_leaves_unknown_and_foreign_placeholders() -> None:
    vault = Vault()
    R.redact("x@y.io", vault)
    out = vault.restore("<EMAIL_1> <EMAIL_9> <NAME_1> <email_1>")
    assert out == "x@y.io <EMAIL_9> <NAME_1> <email_1>"


def test_placeholders_already_in_the_input_are_not_reused() -> None:
    vault = Vault()
    out = R.redact("literal <EMAIL_1> then real a@b.io", vault)
    assert out == "literal <EMAIL_1> then real <EMAIL_2>"
    assert vault.restore(out) == "literal <EMAIL_1> then real a@b.io"
    vault = Vault()  # also when the literal one is in an earlier text of the request
    assert R.redact("see <PHONE_3>", vault) == "see <PHONE_3>"
    assert R.redact("call +1 415 555 0100", vault) == "call <PHONE_4>"


def _stream(vault: Vault, chunks: list[str]) -> tuple[str, list[str]]:
    restorer = vault.stream_restorer()
    shown = [restorer.feed(c) for c in chunks]
    shown.append(restorer.flush())
    return "".join(shown), shown


def test_a_placeholder_split_at_every_position_is_restored() -> None:
    vault = Vault()
    redacted = R.redact("mail sarah.connor@example.com now", vault)
    assert redacted == "mail <EMAIL_1> now"
    for cut in range(len(redacted) + 1):
        text, _ = _stream(vault, [redacted[:cut], redacted[cut:]])
        assert text == "mail sarah.connor@example.com now", cut


def test_character_by_character_and_random_chunking() -> None:
    vault = Vault()
    redacted = R.redact(TEXT, vault)
    text, shown = _stream(vault, list(redacted))
    originals = {vault.restore(m.group()) for m in PLACEHOLDER.finditer(redacted)}
    # fed one character at a time: held back only inside a placeholder, shown whole at its ">"
    assert all(len(piece) <= 1 or piece in originals for piece in shown)
    assert len([p for p in shown if p in originals]) == len(PLACEHOLDER.findall(redacted))
    assert text == TEXT
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(redacted)), rng.randint(1, 12)))
        chunks = [redacted[a:b] for a, b in zip([0, *cuts], [*cuts, len(redacted)], strict=True)]
        assert _stream(vault, chunks)[0] == TEXT


def test_only_a_possible_placeholder_is_held_back() -> None:
    vault = Vault()
    R.redact("a@b.io", vault)
    r = vault.stream_restorer()
    assert r.feed("x < 3 and y <") == "x < 3 and y "  # "<" might start one
    assert r.feed("b> done ") == "<b> done "  # it did not
    assert r.feed("see <EMA") == "see "
    assert r.feed("IL_") == ""
    assert r.feed("1") == ""
    assert r.feed("> ok <html>") == "a@b.io ok <html>"
    assert r.feed("<EMAIL_12345678901") == "<EMAIL_12345678901"  # too many digits: not one
    assert r.feed("tail <PER") == "tail "
    assert r.flush() == "<PER"  # the stream ended inside it: shown as it came


@pytest.mark.parametrize("seed", range(5))
def test_redact_then_restore_is_the_identity(seed: int) -> None:
    rng = random.Random(seed)
    words = ["hello", "Anna Schmidt", "a.b@c.de", "+33 6 12 34 56 78",
             "DE89 3704 0044 0532 0130 00", "192.168.0.1", "Via Roma 3", "version 1.2.3.4",
             "<", ">", "<EMAIL", "_1>", "\n", "ok,"]  # fmt: skip
    text = " ".join(rng.choice(words) for _ in range(300))
    vault = Vault()
    out = R.redact(text, vault)
    assert vault.restore(out) == text
    assert _stream(vault, [out[i : i + 7] for i in range(0, len(out), 7)])[0] == text


HOSTILE = {
    "digits": "1 2 3 4 5 6 7 8 9 0 ",
    "dashes": "12-34-56-78-",
    "ats": "a@",
    "names": "John Smith ",
    "capitals": "Abc ",
    "colons": ":",
    "hex": "ab:",
    "dots": "1.",
    "token": "aB3",
    "streets": "12 Main Street ",
    "via": "Via Roma ",
    "compound": "Hauptstraße ",
    "brackets": "<EMAIL_",
    "assignments": "password=",
}


@pytest.mark.parametrize("unit", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_text_is_linear_and_restorable(unit: str) -> None:
    import time

    text = unit * (50_000 // len(unit))
    vault = Vault()
    started = time.perf_counter()
    out = R.redact(text, vault)
    elapsed = time.perf_counter() - started
    assert vault.restore(out) == text
    assert elapsed < 20, elapsed  # about 0.5 s per 100 KB when the machine is quiet
