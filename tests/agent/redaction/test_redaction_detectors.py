"""Each detector on values people write, and on the look-alikes it must leave alone."""

from __future__ import annotations

import pytest

from agent.redaction import Redactor
from agent.redaction.detectors import iban_ok, luhn_ok

R = Redactor()
GH = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
EF = "ef-k9x2-Q3VbN7mZpL0sTy8wR2uXcD4eFg"  # an edgefleet API key's shape


def found(text: str) -> list[tuple[str, str]]:
    return [(text[s.start : s.end], s.type) for s in R.detect(text)]


@pytest.mark.parametrize(
    ("text", "value", "type_"),
    [
        ("mail me at jane.doe+work@example.co.uk please", "jane.doe+work@example.co.uk", "EMAIL"),
        ("Kontakt: müller@beispiel.de.", "müller@beispiel.de", "EMAIL"),
        ("call +1 (415) 555-0132 today", "+1 (415) 555-0132", "PHONE"),
        ("tel. +44 20 7946 0958", "+44 20 7946 0958", "PHONE"),
        ("ruf an: 0171 2345678", "0171 2345678", "PHONE"),
        ("appelle le 06 12 34 56 78", "06 12 34 56 78", "PHONE"),
        ("my cell is 415-555-0199", "415-555-0199", "PHONE"),
        ("+49 (0)30 901820 is the office", "+49 (0)30 901820", "PHONE"),
        ("card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111", "CREDIT_CARD"),
        ("amex 3782-822463-10005", "3782-822463-10005", "CREDIT_CARD"),
        ("pay to 5555555555554444.", "5555555555554444", "CREDIT_CARD"),
        ("IBAN DE89 3704 0044 0532 0130 00 thanks", "DE89 3704 0044 0532 0130 00", "IBAN"),
        ("iban: GB82WEST12345698765432", "GB82WEST12345698765432", "IBAN"),
        ("FR14 2004 1010 0505 0001 3M02 606 is mine", "FR14 2004 1010 0505 0001 3M02 606", "IBAN"),
        ("SSN 536-22-1234.", "536-22-1234", "US_SSN"),
        ("my social security number is 536221234", "536221234", "US_SSN"),
        ("host 192.168.10.4 is down", "192.168.10.4", "IP_ADDRESS"),
        ("subnet 10.0.0.0/8", "10.0.0.0/8", "IP_ADDRESS"),
        ("v6 is 2001:db8:85a3::8a2e:370:7334 ok", "2001:db8:85a3::8a2e:370:7334", "IP_ADDRESS"),
        ("loopback ::1 only", "::1", "IP_ADDRESS"),
        ("OPENAI_API_KEY=sk-proj-Ab3dEf9hIjK1mNoPqRsT", "sk-proj-Ab3dEf9hIjK1mNoPqRsT", "SECRET"),
        ("token " + GH, GH, "SECRET"),
        ("aws AKIAIOSFODNN7EXAMPLE key", "AKIAIOSFODNN7EXAMPLE", "SECRET"),
        ('{"password": "correct-horse-battery"}', "correct-horse-battery", "SECRET"),
        ("Authorization: Bearer abc123DEF456ghi789", "abc123DEF456ghi789", "SECRET"),
        ("the key is " + EF, EF, "SECRET"),
        ("secret: q8F3kZ9vL2mX7nB4wR6tY1uP0sD5gH", "q8F3kZ9vL2mX7nB4wR6tY1uP0sD5gH", "SECRET"),
        ("postgres://app:Tr0ub4dor&3@db:5432/x", "Tr0ub4dor&3", "SECRET"),
        ("user admin / pass Qz7!mW2#pLx9 please rotate", "Qz7!mW2#pLx9", "SECRET"),
        ("office (373)504-3201x7185 ext", "(373)504-3201x7185", "PHONE"),
        ("maestro 630473491706 ok", "630473491706", "CREDIT_CARD"),
    ],
)  # fmt: skip
def test_structured_values_are_found(text: str, value: str, type_: str) -> None:
    assert (value, type_) in found(text)


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 failed",  # Luhn fails
        "order 1234567812345678 shipped",  # Luhn fails
        "IBAN DE89 3704 0044 0532 0130 01",  # mod-97 fails
        "GB82WEST1234569876543",  # wrong length for GB
        "SSN 000-12-3456 and 666-12-3456 and 912-12-3456",  # never issued
        "upgrade to version 1.2.3.4 today",
        "running v10.0.0.1 in prod",
        "pip install foo==2.0.1.3",
        "mac 00:1a:2b:3c:4d:5e on the switch",
        "meeting at 12:30:45 on 2024-01-15",
        "commit 3f2a9c1e5b7d4e6f8a0b1c2d3e4f5a6b7c8d9e0f fixed it",
        "uuid 123e4567-e89b-12d3-a456-426614174000",
        "total 1,234.56 EUR for 3 items",
        "see RFC 7231 section 6.5.1",
        "the function getUserAccountSettingsFromCache is slow",
        "404 Not Found after 30 s",
        "please pass the salt and the password field",
        "firmware 3.5.2.1 rolled out",
    ],
)
def test_look_alikes_are_left_alone(text: str) -> None:
    assert found(text) == []


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Please forward this to John Smith in accounts.", "John Smith"),
        ("Dear Mr. Okafor, thank you.", "Okafor"),
        ("Frau Dr. Schneider-Weiß kommt morgen", "Schneider-Weiß"),
        ("ask Maria van der Berg about it", "Maria van der Berg"),
        ("Jean-Luc Picard signed it", "Jean-Luc Picard"),
        ("Hi Priya,\nthe build is green.", "Priya"),
        ("Thanks,\nGiulia", "Giulia"),
        ("my name is Olusegun Adeyemi", "Olusegun Adeyemi"),
        ("Hans D. Henck will call", "Hans D. Henck"),
        ("ok\nBen: the visa one", "Ben"),
        ("Grace said the wifi is down", "Grace"),
        ("Cheers,\nMark", "Mark"),
    ],
)
def test_person_names(text: str, value: str) -> None:
    assert (value, "PERSON") in found(text)


@pytest.mark.parametrize(
    "text",
    [
        "May I ask what the Python Software Foundation thinks?",
        "The New York Times reported it on Monday.",
        "Will you merge the pull request?",
        "Use the Linux Kernel Mailing List.",
        "We flew to Paris and then to Victoria Station.",
        "Beste klant, bedankt voor uw bestelling.",
    ],
)
def test_capitalised_words_that_are_not_names(text: str) -> None:
    assert [t for _, t in found(text)] == []


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("ship it to 221B Baker Street, London NW1 6XE.", "221B Baker Street, London NW1 6XE"),
        ("1600 Pennsylvania Avenue NW, Washington, DC 20500", "1600 Pennsylvania Avenue NW, "
         "Washington, DC 20500"),
        ("391 Johnson Burg Apt. 636 is the place", "391 Johnson Burg Apt. 636"),
        ("Ich wohne in der Hauptstraße 12a, 10115 Berlin.", "Hauptstraße 12a, 10115 Berlin"),
        ("Adres: Keizersgracht 123, 1015 CJ Amsterdam", "Keizersgracht 123, 1015 CJ Amsterdam"),
        ("chez moi: 23, rue Victor Hugo, 75001 Paris", "23, rue Victor Hugo, 75001 Paris"),
        ("abito in Via Roma 3, 00184 Roma", "Via Roma 3, 00184 Roma"),
        ("vivo en Calle de Alcalá 42, Madrid", "Calle de Alcalá 42"),
    ],
)  # fmt: skip
def test_street_addresses(text: str, value: str) -> None:
    assert (value, "ADDRESS") in found(text)


def test_checksums() -> None:
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")
    assert iban_ok("NL91ABNA0417164300") and not iban_ok("NL91ABNA0417164301")
    assert not iban_ok("XX91ABNA0417164300")  # no such country


def test_types_can_be_narrowed() -> None:
    only = Redactor(types=["EMAIL"])
    spans = only.detect("a@b.io and 192.168.1.1 and John Smith")
    assert [s.type for s in spans] == ["EMAIL"]
