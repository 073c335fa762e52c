"""The labeled sets of the redaction benchmark, in ``benchmarks/data/redaction/``.

Both files use one markup: documents separated by a line ``---`` (lines starting ``# ``
at a document's top are comments), each personal value written as ``[[TYPE|value]]``
(TYPE one of the agent's entity types); everything else is text that must be left alone.
:func:`load` turns a file into (text, spans) documents.

- ``generated.txt``: written by ``python -m benchmarks.redaction_data`` (seeded, so the
  same file every time) from Faker's providers in 7 locales and the templates below, with
  hard negatives (Luhn-failing card-like numbers, IBANs with a wrong check, SSNs that are
  never issued, version strings that look like IPv4 addresses, hashes, UUIDs, dates,
  capitalised words that are not names).
- ``handwritten.txt``: written by hand, the way people write (chat, e-mail, tickets, logs,
  code), not from these templates; names and addresses there are mostly not from Faker.
  The detectors' rules were adjusted (generally, never per example) after reading its misses.
- ``heldout.txt``: hand-written the same way after a change to the detectors and never used
  to change them until issue 27, which tunes against it: from then on it is a tuning set
  (reported as ``tuning``), no longer a held-out measure.
- ``heldout_world.txt``: the held-out measure since issue 27, written by
  ``python -m benchmarks.redaction_heldout`` from name lists the gazetteer is not built from
  (never Faker), committed before any detector change and pinned by sha256 in
  ``benchmarks/redaction.py``. Each document starts with ``# region: NAME`` and
  ``# kind: positive|negative`` lines, read by :func:`load_documents`.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data" / "redaction"
_MARK = re.compile(r"\[\[([A-Z_]+)\|(.*?)\]\]", re.DOTALL)

Span = tuple[int, int, str]


def parse(doc: str) -> tuple[str, list[Span]]:
    text: list[str] = []
    spans: list[Span] = []
    pos = 0
    length = 0
    for m in _MARK.finditer(doc):
        plain = doc[pos : m.start()]
        text.append(plain)
        length += len(plain)
        value = m.group(2)
        spans.append((length, length + len(value), m.group(1)))
        text.append(value)
        length += len(value)
        pos = m.end()
    text.append(doc[pos:])
    return "".join(text), spans


@dataclass(frozen=True, slots=True)
class Document:
    text: str
    spans: list[Span]
    # the ``# key: value`` comment lines at its top (``region``, ``kind``); empty if none
    notes: dict[str, str]


_NOTE = re.compile(r"^# ([a-z_]+): (\S+)$")


def load_documents(path: Path) -> list[Document]:
    raw = path.read_text(encoding="utf-8")
    docs = []
    for doc in re.split(r"(?m)^---$", raw):
        lines = doc.strip("\n").split("\n")
        notes: dict[str, str] = {}
        while lines and lines[0].startswith("# "):  # a comment line (the locale, a note)
            m = _NOTE.match(lines.pop(0))
            if m:
                notes[m.group(1)] = m.group(2)
        if "\n".join(lines).strip():
            text, spans = parse("\n".join(lines))
            docs.append(Document(text, spans, notes))
    return docs


def load(path: Path) -> list[tuple[str, list[Span]]]:
    return [(d.text, d.spans) for d in load_documents(path)]


# ------------------------------------------------------------------------- generation

LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "it_IT", "es_ES", "nl_NL")

# {TYPE} slots are labeled values; {neg_*} slots are hard negatives (left unlabeled).
TEMPLATES = (
    "Hi {PERSON}, your order {neg_order} ships to {ADDRESS} on {neg_date}.",
    "Please contact {PERSON} at {EMAIL} or {PHONE} about ticket #{neg_ticket}.",
    "My card number is {CREDIT_CARD}; the old one {neg_card} was cancelled.",
    "Transfer the deposit to IBAN {IBAN} (not {neg_iban}, that one bounced).",
    "SSN on file: {US_SSN}. The form rejected {neg_ssn} as invalid.",
    "The server at {IP_ADDRESS} runs {neg_version} of the agent.",
    "Failed login from {IP_ADDRESS} for user {EMAIL} at {neg_time}.",
    "export OPENAI_API_KEY={SECRET}\nexport BUILD_SHA={neg_sha}",
    "Dear {PERSON},\n\nthank you for your letter of {neg_date}. We will call you on {PHONE}.",
    "Customer {PERSON} lives at {ADDRESS} and pays with card {CREDIT_CARD}.",
    "Shipping label: {PERSON}, {ADDRESS}. Tracking {neg_tracking}.",
    "Can you ask {PERSON} to send the contract to {EMAIL}? Release {neg_version} is blocked.",
    "Ref {neg_uuid}: refund to {IBAN} approved by {PERSON}.",
    "Patient {PERSON}, SSN {US_SSN}, phone {PHONE}, address {ADDRESS}.",
    "config: host={IP_ADDRESS} password={SECRET} retries=3 timeout={neg_time}",
    "Meeting with {PERSON} moved to {neg_date}; dial in via {PHONE}.",
    "{PERSON} wrote: please update my address to {ADDRESS}.",
    "Invoice {neg_order} for {PERSON} ({EMAIL}) totals {neg_amount} EUR.",
    "Reach me at {PHONE} or {EMAIL}. - {PERSON}",
    "curl -H 'Authorization: Bearer {SECRET}' https://api.example.com/v1/items",
    "The VPN gateway {IP_ADDRESS} and the backup {IP_ADDRESS} both dropped at {neg_time}.",
    "Wire {neg_amount} to {IBAN}, reference {neg_ticket}, beneficiary {PERSON}.",
    "Hallo {PERSON}, bitte schick die Unterlagen an {ADDRESS}. Danke!",
    "Bonjour {PERSON}, votre colis arrive au {ADDRESS} le {neg_date}.",
    "Ciao {PERSON}, il mio numero è {PHONE} e la mail {EMAIL}.",
    "Hola {PERSON}, mi IBAN es {IBAN} y mi teléfono {PHONE}.",
    "Beste {PERSON}, ons nieuwe adres is {ADDRESS}.",
    "Stack trace mentions {neg_version} and {neg_sha}; reporter {EMAIL}.",
    "Card {CREDIT_CARD} declined, fallback card {neg_card} also declined for {PERSON}.",
    "Employee {PERSON} (SSN {US_SSN}) badge {neg_ticket} reassigned to {PERSON}.",
    "The Python Software Foundation and Microsoft Teams meet on {neg_date} in New York.",
    "GitHub token {SECRET} leaked in commit {neg_sha}.",
    "Our AWS key {SECRET} must be rotated before {neg_date}.",
    "Forward the logs from {IP_ADDRESS} to {EMAIL} by {neg_time}.",
    "{PERSON} and {PERSON} share the flat at {ADDRESS}.",
    "Upgrade to {neg_version} fixed it; see build {neg_uuid}.",
    "Send the replacement card ending {neg_last4} to {ADDRESS}, attention {PERSON}.",
    "New subscriber: {PERSON} <{EMAIL}>, phone {PHONE}, IP {IP_ADDRESS}.",
)


def _luhn_digit(partial: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(partial)):
        d = int(ch)
        if i % 2 == 0:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


class Values:
    def __init__(self, seed: int) -> None:
        from faker import Faker

        self.rng = random.Random(seed)
        self.fakers = {}
        for i, loc in enumerate(LOCALES):
            fake = Faker(loc)
            fake.seed_instance(seed + i)
            self.fakers[loc] = fake
        self.us = self.fakers["en_US"]

    def value(self, kind: str, loc: str) -> str:
        f = self.fakers[loc]
        rng = self.rng
        if kind == "PERSON":
            return f"{f.first_name()} {f.last_name()}"
        if kind == "ADDRESS":
            if rng.random() < 0.3:
                return f.address().replace("\n", ", ")
            return f.street_address()
        if kind == "EMAIL":
            return f.email() if rng.random() < 0.7 else f.free_email()
        if kind == "PHONE":
            return f.phone_number()
        if kind == "CREDIT_CARD":
            number = self.us.credit_card_number()
            if rng.random() < 0.4 and len(number) == 16:
                number = " ".join(number[i : i + 4] for i in range(0, 16, 4))
            return number
        if kind == "IBAN":
            iban = f.iban()
            if rng.random() < 0.5:
                iban = " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))
            return iban
        if kind == "US_SSN":
            return self.us.ssn()
        if kind == "IP_ADDRESS":
            r = rng.random()
            return f.ipv4() if r < 0.5 else f.ipv4_private() if r < 0.75 else f.ipv6()
        if kind == "SECRET":
            return self.secret()
        raise ValueError(kind)

    def secret(self) -> str:
        rng = self.rng
        alnum = string.ascii_letters + string.digits

        def tok(n: int, chars: str = alnum) -> str:
            return "".join(rng.choice(chars) for _ in range(n))

        shape = rng.randrange(6)
        if shape == 0:
            return "sk-proj-" + tok(40)
        if shape == 1:
            return "ghp_" + tok(36)
        if shape == 2:
            return "AKIA" + tok(16, string.ascii_uppercase + string.digits)
        if shape == 3:
            return "xoxb-" + tok(12, string.digits) + "-" + tok(24)
        if shape == 4:
            return "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI" + tok(20) + "." + tok(43)
        return tok(32)

    def negative(self, kind: str) -> str:
        rng = self.rng
        if kind == "neg_card":  # a card-like number that fails Luhn
            body = "4" + "".join(rng.choice(string.digits) for _ in range(14))
            good = _luhn_digit(body)
            bad = str((int(good) + rng.randint(1, 9)) % 10)
            return body + bad
        if kind == "neg_iban":
            iban = self.fakers["de_DE"].iban()
            check = int(iban[2:4])
            return iban[:2] + f"{(check + rng.randint(1, 50)) % 97 + 2:02d}" + iban[4:]
        if kind == "neg_ssn":
            return (
                rng.choice(["000", "666", "987"])
                + f"-{rng.randint(10, 99)}-"
                + (f"{rng.randint(1000, 9999)}")
            )
        if kind == "neg_version":
            parts = [str(rng.randint(0, 12)) for _ in range(4)]
            return rng.choice(["v", "version ", "v", "release "]) + ".".join(parts)
        if kind == "neg_sha":
            return f"{rng.getrandbits(160):040x}"
        if kind == "neg_uuid":
            return str(self.us.uuid4())
        if kind == "neg_date":
            return f"{rng.randint(1970, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        if kind == "neg_time":
            return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        if kind == "neg_order":
            return f"{rng.choice(['ORD', 'INV', 'PO'])}-{rng.randint(100000, 999999)}"
        if kind == "neg_ticket":
            return str(rng.randint(1000, 99999))
        if kind == "neg_tracking":
            chars = string.ascii_uppercase + string.digits
            return "1Z" + "".join(rng.choice(chars) for _ in range(16))
        if kind == "neg_amount":
            return f"{rng.randint(10, 99999):,}.{rng.randint(0, 99):02d}"
        if kind == "neg_last4":
            return f"{rng.randint(0, 9999):04d}"
        raise ValueError(kind)


_SLOT = re.compile(r"\{([A-Za-z_0-9]+)\}")


def generate(n_docs: int = 420, seed: int = 11) -> str:
    values = Values(seed)
    rng = values.rng
    docs = []
    for i in range(n_docs):
        template = TEMPLATES[i % len(TEMPLATES)]
        loc = LOCALES[rng.randrange(len(LOCALES))]
        # SSNs are American, the localized greetings use their own locale
        if "SSN" in template:
            loc = "en_US"
        for word, lang in (("Hallo", "de_DE"), ("Bonjour", "fr_FR"), ("Ciao", "it_IT"),
                           ("Hola", "es_ES"), ("Beste", "nl_NL")):  # fmt: skip
            if template.startswith(word):
                loc = lang

        def fill(m: re.Match[str]) -> str:
            slot = m.group(1)
            if slot.startswith("neg_"):
                return values.negative(slot)
            return f"[[{slot}|{values.value(slot, loc)}]]"  # noqa: B023 (called at once)

        docs.append(f"# {loc}\n" + _SLOT.sub(fill, template))
    return "\n---\n".join(docs) + "\n"


def main() -> None:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    out = DATA_DIR / "generated.txt"
    out.write_text(generate(), encoding="utf-8")
    docs = load(out)
    spans = sum(len(s) for _, s in docs)
    print(f"{out}: {len(docs)} documents, {spans} spans")


if __name__ == "__main__":
    main()
