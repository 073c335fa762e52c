# ruff: noqa: RUF001 (Turkish, Cyrillic and CJK letters in the street words are meant)
"""Person names and street addresses, offline: a gazetteer and context rules.

The gazetteer (``data/gazetteer.json``, written by :mod:`agent.redaction.build_gazetteer`
from Faker's locale providers and the word and place lists its ``sources`` name) holds about
30,000 given names, 35,000 family names and the street words of every Faker locale's address
provider, and a lexicon of English and other languages' words and of places. A PERSON is

- a title (Mr, Dr, Frau, Mme, Sr., ...) and one to three capitalised words after it;
- a known given name (not one of the common words that are also given names, such as May
  or Will) and one to three capitalised words or family-name particles (van, de, di, ...);
- a single known given or family name after a cue that introduces a person ("Dear",
  "Hi", "my name is", "ask", "cc", "Regards," ...).

Names in no list are told by what their words are not: the gazetteer's ``dictionary_words``,
``frequent_words``, ``foreign_words`` and ``places`` (:func:`lexicon`) say what else a
capitalised word may be. A listed family name and an unlisted word, two unlisted words, or
one listed or name-shaped unlisted word alone after a lower-case word (not an article, a
determiner or a preposition of place) are a PERSON; so is an unlisted word whose letters
look like a listed name's (:func:`name_likeness`, a letter-trigram model built at warm-up).
An unlisted word is also a name after a greeting or thanks (in 40-odd forms), a relation
("my colleague"), a sign-off, a dash signature or an ``@``, before past-tense speech, or
opening a sentence before what people do; a listed given name opening a sentence before a
lower-case word; a Cyrillic word inside a sentence; the other plain names of a list one of
whose words is a name; words in capitals after a label (``Passenger: MR X Y``).

An ADDRESS is a house number and a street name ending in a street word ("12 Baker Street",
"391 Johnson Burg Apt. 636"), a street word and a name then a house number ("Via Roma 3",
"Calle de Alcalá, 42", "23, rue Victor Hugo"), or a compound street and a number
("Hauptstraße 12a", "Keizersgracht 123"); then a unit (Apt, Suite, Piso ...) and a postcode
with its city when they follow.
"""

from __future__ import annotations

import math
import re
import unicodedata
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import cache, lru_cache
from itertools import chain
from typing import NamedTuple

from agent.redaction import gazetteer_file
from agent.redaction.detectors import ADDRESS, PERSON, Span
from agent.redaction.mark_words import ADMIN_UNIT, COMPOUND_ENDINGS, ENDING_WORDS
from agent.redaction.name_shapes import (
    korean_shaped,
    name_shaped,
    open_syllabled,
    pinyin_only,
    pinyin_shaped,
    romaji_shaped,
)
from agent.redaction.name_shapes import warm_up as name_shapes_warm_up
from agent.redaction.prefilter import finditer_from, first_words, marks, word_starts
from agent.redaction.prefilter import words as word_set
from agent.redaction.script_names import find_script_persons
from agent.redaction.script_names import warm_up as _script_warm_up
from agent.redaction.trie import trie_regex

# Capitalised words that are given names in some locale but far more often something else.
_NOT_A_START = frozenset(
    [
        "Can",
        "My",
        "May",
        "June",
        "April",
        "August",
        "Server",
        "India",
        "Israel",
        "Georgia",
        "Virginia",
        "Carolina",
        "Dakota",
        "Washington",
        "Lincoln",
        "Jackson",
        "Austin",
        "Phoenix",
        "Orlando",
        "Sydney",
        "Paris",
        "Florence",
        "Chelsea",
        "Devon",
        "Kent",
        "Jordan",
        "Victoria",
        "Summer",
        "Autumn",
        "Dawn",
        "Hope",
        "Faith",
        "Joy",
        "Grace",
        "Bill",
        "Mark",
        "Guy",
        "Rob",
        "Don",
        "Will",
        "Van",
        "Von",
        "Ivy",
        "Ruby",
        "Pearl",
        "Amber",
        "Jade",
        "Rose",
        "Sunny",
        "Lane",
        "Page",
        "Price",
        "Young",
        "Long",
        "King",
        "Hall",
        "Wood",
        "Stone",
        "Green",
        "White",
        "Black",
        "Brown",
        "Gray",
        "Grey",
        "Major",
        "Doctor",
        "Sir",
        "Miss",
        "Mister",
        "Madame",
        "Dear",
        "Hi",
        "Hello",
        "Street",
        "Road",
        "Avenue",
        "Park",
        "Close",
        "The",
        "And",
        "Best",
        "Thanks",
        "Christian",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "January",
        "February",
        "March",
        "July",
        "September",
        "October",
        "November",
        "December",
        "Easter",
        "Christmas",
        "North",
        "South",
        "East",
        "West",
        "New",
        "Old",
        "Saint",
        "San",
        "Santa",
        "Santo",
        "Love",
        "Sky",
        "Star",
        "Mercedes",
        "Apple",
        "Angel",
        "Golden",
        "Noble",
        "Rich",
        "Major",
        "Royal",
        "Case",
        "Chase",
        "Cash",
        "Deal",
        "Ever",
        "Gay",
        "Hunter",
        "Independence",
        "Justice",
        "Liberty",
        "Patience",
        "Precious",
        "Pleasant",
        "Sterling",
        "Ocean",
        "River",
        "Forest",
        "Field",
        "Heaven",
        "Story",
        "Storm",
        "Unique",
        "Wisdom",
        "Zion",
        "Harmony",
        "Miracle",
        "Princess",
        "Prince",
        "Queen",
        "Memory",
        "Marvel",
        "Honor",
        "Honour",
        "Legend",
        "Royalty",
        "Trinity",
        "Genesis",
        "Journey",
        "Lucky",
        "Happy",
        "Sage",
        "Echo",
        "Haven",
        "Cloud",
        "Rain",
        "Snow",
        "Bear",
        "Wolf",
        "Fox",
        "Hawk",
        "Eagle",
        "Sparrow",
        "Robin",
        "Jay",
        "Dove",
        "Raven",
        "Crow",
        "Finch",
        "Lark",
        "Swan",
    ]
)
# Words that never continue a name (function words, common sentence starts).
_NOT_A_NAME = frozenset(
    [
        "The",
        "A",
        "An",
        "And",
        "Or",
        "But",
        "If",
        "Then",
        "So",
        "Is",
        "Are",
        "Was",
        "Were",
        "Be",
        "Been",
        "Has",
        "Have",
        "Had",
        "Do",
        "Does",
        "Did",
        "I",
        "You",
        "He",
        "She",
        "It",
        "We",
        "They",
        "Me",
        "Him",
        "Her",
        "Us",
        "Them",
        "My",
        "Your",
        "His",
        "Its",
        "Our",
        "Their",
        "This",
        "That",
        "These",
        "Those",
        "What",
        "Which",
        "Who",
        "Whom",
        "Whose",
        "When",
        "Where",
        "Why",
        "How",
        "Not",
        "No",
        "Yes",
        "Please",
        "Thanks",
        "Thank",
        "Hi",
        "Hello",
        "Dear",
        "Regards",
        "Best",
        "Cheers",
        "Sincerely",
        "In",
        "On",
        "At",
        "To",
        "For",
        "From",
        "With",
        "By",
        "Of",
        "As",
        "About",
        "Into",
        "Over",
        "After",
        "Before",
        "Under",
        "Between",
        "Through",
        "During",
        "Without",
        "Within",
        "Also",
        "Just",
        "Only",
        "Here",
        "There",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
        "Street",
        "Road",
        "Avenue",
        "Inc",
        "Ltd",
        "LLC",
        "GmbH",
        "AG",
        "SA",
        "Corp",
        "Co",
        "Team",
        "Support",
        "Office",
        "Department",
        "Bank",
        "Hospital",
        "University",
        "School",
        "Der",
        "Die",
        "Das",
        "Und",
        "Le",
        "La",
        "Les",
        "Et",
        "Il",
        "Lo",
        "El",
        "Los",
        "Las",
        "Y",
    ]
)
# Greetings and sign-offs in the supported languages (never the first word of a name).
_GREETINGS = frozenset(
    "Beste Hallo Bonjour Hola Ciao Liebe Lieber Cher Chère Querido Querida Caro Cara Gentile "  # noqa: SIM905
    "Salut Hey Gracias Grazie Danke Merci Bedankt Groeten Saludos Saluti Grüße Gruß".split()
)
_PARTICLES = frozenset(
    [
        "van",
        "von",
        "de",
        "der",
        "den",
        "da",
        "di",
        "del",
        "della",
        "dos",
        "das",
        "du",
        "le",
        "la",
        "ten",
        "ter",
        "y",
        "bin",
        "al",
        "af",
        "zu",
        "dei",
        "degli",
        # Arabic, Malay, Filipino, Berber, Welsh particles
        "binti",
        "bint",
        "ibn",
        "bte",
        "bt",
        "abu",
        "el",
        "ben",
        "ould",
        "dela",
        "delos",
        "ap",
    ]
)
_TITLES = (
    r"Mr|Mrs|Ms|Mx|Miss|Dr|Prof|Professor|Sir|Dame|Lady|Lord|Herr|Frau|Mme|Mlle|Madame|"
    r"Monsieur|M|Sr|Sra|Srta|Señor|Señora|Don|Doña|Sig|Sig\.ra|Signor|Signora|Dott|Dott\.ssa|"
    r"Ing|Mag|Dhr|Mevr|Mevrouw|Meneer|Captain|Capt|Officer|Judge|Rev|Fr|Pastor|Nurse|Coach|"
    r"Aunt|Auntie|Uncle|Cousin|Grandma|Grandpa|Granny|Tante|Onkel|Oma|Opa|Tía|Tío|Zia|Zio|Oom|"
    # South-East Asian, South Asian, Arabic, West African, Slavic forms of address
    r"Pak|Bapak|Bu|Ibu|Mbak|Encik|Cik|Puan|Tuan|Datuk|Dato|Datin|Haji|Hajah|Hajjah|Khun|Ông|Bà|"
    r"Chị|Kuya|Aling|Shri|Shrimati|Smt|Sri|Kumari|Sheikh|Shaikh|Sayyid|Sayed|Ustadh|Ustaz|"
    r"Ustazah|Chief|Alhaji|Alhaja|Mallam|Malam|Oga|Madam|Pani|Pan|Gospodin|Gospozha|"
    r"господин|госпожа|г-н|г-жа|пан|пані"
)
# Honorifics written after a romanized name (Tanaka-san, Min-jun-ssi, Sharma-ji).
_HONORIFIC_SUFFIXES = frozenset(["san", "sama", "sensei", "kun", "chan", "ssi", "nim", "ji"])
_FOREIGN_GREETINGS = (
    r"danke|danke schön|vielen dank|merci|merci beaucoup|salut|gracias|muchas gracias|"
    r"obrigado|obrigada|olá|oi|grazie|salve|bedankt|dank je|dank u|hoi|dziękuję|dzięki|cześć|"
    r"děkuji|díky|ahoj|tack|tak|takk|hej|hei|kiitos|moi|köszönöm|szia|mulțumesc|bună|"
    r"teşekkürler|teşekkür ederim|sağ ol|merhaba|selam|terima kasih|selamat pagi|halo|"
    r"cảm ơn|cám ơn|chào|xin chào|salamat|спасибо|благодарю|привет|здравствуйте|дякую|"
    r"привіт|вітаю|ευχαριστώ|γεια σου|γεια|sehr geehrte|sehr geehrter|chers|estimado|"
    r"estimada|prezado|prezada|gentile|egregio|geachte|kære|kära|hyvä|drogi|droga|szanowny|"
    r"szanowna|vážený|vážená|sayın|уважаемый|уважаемая|дорогой|дорогая|шановний|шановна|"
    r"anh|chị|em"
)
_CUES = (
    r"dear|hi|hello|hey|thanks|thank you|cc|ask|tell|call|email|e-mail|ping|contact|phone|"
    r"text|meet|met|with|by|from|name is|name's|named|called|i am|i'm|this is|signed|"
    r"regards,|cheers,|best,|thanks,|sincerely,|patient|customer|client|employee|user|"
    r"hallo|liebe|lieber|bonjour|cher|chère|hola|querido|querida|ciao|caro|cara|beste|"
    r"c'est|je suis|ich bin|soy|sono|ik ben|thx|ty|intern|colleague|manager|friend|"
    r"neighbour|neighbor|wife|husband|son|daughter|boss|mom|mum|dad|sister|brother|partner|"
    r"see|and|or|attention|attn|for|to|" + _FOREIGN_GREETINGS
    # thanks, greetings and "dear" in other languages (Danke, Jürgen; Merci, Aurélie;
    # Cảm ơn anh Tuấn; Спасибо, Ольга; Ευχαριστώ, Μαρία)
)
_UPPER = (
    "A-ZÀ-ÖØ-Þ"
    + "".join(chr(c) for c in range(0x100, 0x250) if chr(c).isupper())
    + "Ѐ-ЯΆ-Ϋ"  # Cyrillic and Greek capitals
)
_WORD = r"[^\W\d_][\w'\u2019]*(?:-[^\W\d_][\w'\u2019]*)*"
_CAP_WORD = rf"[{_UPPER}][\w'\u2019]*(?:-[^\W\d_][\w'\u2019]*)*"
# A run of words starting with a capitalised one (names' particles may be lower case).
_INITIAL = re.compile(rf"[{_UPPER}]\.")
_NEXT_WORD = rf"(?:[{_UPPER}]\.(?= )|{_WORD})"  # a word, or an initial ("D.")
# A leading lookbehind keeps re from skipping ahead to a possible first character (it tries
# every position): the patterns scanned over whole texts check what is before their first
# character after it, with a two-character lookbehind (the same matches, several times faster).
_CAP_RUN = re.compile(
    rf"[{_UPPER}](?<![\w@./\\-][\s\S])[\w'\u2019]*(?:-[^\W\d_][\w'\u2019]*)*"
    rf"(?:[ ](?:{trie_regex(_PARTICLES)}[ ])*{_NEXT_WORD})*"
)
_TITLE_WORDS = frozenset(t.replace("\\", "").lower() for t in _TITLES.split("|"))
_CUE_PHRASES = frozenset(c.rstrip(",") for c in _CUES.split("|"))
# Cues after which any capitalised words are a name, known or not.
_STRONG_CUES = frozenset(
    [
        "my name is",
        "my name's",
        "name",
        "names is",
        "name is",
        "dear",
        "je m'appelle",
        "ich heiße",
        "ich heisse",
        "me llamo",
        "mi chiamo",
        "mijn naam is",
        "patient",
        "signed",
        "signed by",
        # field labels and roles that introduce a person
        "account holder",
        "holder",
        "cardholder",
        "card holder",
        "account name",
        "full name",
        "customer name",
        "client name",
        "ship to",
        "deliver to",
        "recipient",
        "beneficiary",
        "passenger",
        "guest",
        "tenant",
        "applicant",
        "attn",
        "attn.",
        "attention",
        "c/o",
        "consignee",
        "payee",
        "addressee",
        "contact person",
        "next of kin",
        "prepared by",
        "approved by",
        "issued to",
        "assigned to",
        "billed to",
        "bill to",
        "policyholder",
        "insured",
        "employee",
        "driver",
        "candidate",
        "student",
        "emergency contact",
    ]
)


# Labels that introduce a name only as labels (after a colon): the words for given and
# family names in several languages (one word is enough: "Vorname: Zewdu"), and the parties
# of a form or a message (two words or more: "Customer: Zewdu Girma", not "Client: Globex")
_NAME_LABELS = frozenset(
    "surname forename vorname nachname nombre apellido apellidos nom prénom nome cognome "  # noqa: SIM905
    "naam voornaam achternaam imię nazwisko nama имя фамилия отчество фио".split()
) | frozenset(
    ("last name", "family name", "first name", "given name", "given names", "middle name",
     "maiden name", "nom de famille")
)  # fmt: skip
_PARTY_LABELS = frozenset(
    "from to cc bcc customer client owner sender reviewer author buyer seller user member "  # noqa: SIM905
    "caller contact requester reporter".split()
) | frozenset(("reported by", "requested by", "created by"))
_LABEL_CUES = _NAME_LABELS | _PARTY_LABELS
# The last word of a business's or a team's name
_ORGANISATION_WORDS = frozenset(
    "Corp Corporation Inc Ltd Llc LLC GmbH AG SA SAS BV NV Plc PLC Co Company Group Team "  # noqa: SIM905
    "Office Support Desk Department Services Service Bank Hotel Store Shop Clinic".split()
)
# After "Last" in a label's "Last, First": the given name, ending the field
_FIRST_AFTER_LAST = re.compile(r", ([A-Z][\w'\u2019-]+)(?=[ \t]*(?:$|\n|\(|;|\|))")


def _after_label(before: str, words: list[str]) -> bool:
    """Capitalised words after a label and its colon or dash ("Customer: Zewdu Girma", "Vorname:
    Zewdu"): each a listed name or a word in no list that is no English word or place, the
    last no business's word; one word only after a label for a name."""
    if not before.rstrip(" \t").endswith((":", " -", " \u2013", " \u2014")):
        return False  # "Customer:", "Owner - "
    label = before.rstrip(" \t\u2013\u2014-")
    if not _cue_before(label, _NAME_LABELS if len(words) == 1 else _LABEL_CUES):
        return False
    return words[-1] not in _ORGANISATION_WORDS and all(_label_name(w) for w in words)


def _speaking_pair(words: list[str], text: str, end: int) -> bool:
    """Two words in no list before past-tense speech ("Zewdu Girma wrote:"), each no
    English word or place (a business's words are English words, places, or not written as a
    name is: Acme Corp, Lagos Office, Initech GmbH)."""
    if len(words) != 2:
        return False
    if _PAST_SPEECH_AFTER.match(text, end) is None:
        return False
    return all(_label_name(w) for w in words)


def _label_name(word: str) -> bool:
    """:func:`_name_or_unlisted`, and no English word, place, placeholder or role."""
    lex = lexicon()
    return (
        _name_or_unlisted(word)
        and fold(word).lower() not in lex.dictionary
        and not _known(word, lex.places)
        and word not in _NO_NAME_VALUES
        and word not in _ROLE_WORDS
    )


def _cue_before(before: str, cues: frozenset[str]) -> bool:
    return not cues.isdisjoint(_cue_phrases(before))


@lru_cache(maxsize=1024)
def _cue_phrases(before: str) -> tuple[str, ...]:
    """The last one, two and three words before a name, lower case (the cue phrases that
    can end there); remembered, as find_persons asks several cue lists about the same text
    before a word (and the same texts recur: "Name: ", "Dear ")."""
    words = before.rstrip(" ,:\n").lower().split()[-3:]
    return tuple(" ".join(words[k:]).lstrip("(\"'") for k in range(len(words)))


_SPEECH_AFTER = re.compile(
    r"(?:'s)?\s(?:said|says|wrote|writes|told|tells|asked|asks|thinks|thought|mentioned|"
    r"replied|called|emailed|texted|sent|will|is|was|has|had|and I|agreed|confirmed)\b"
)
_PLACE_WORDS = frozenset(
    "New Old North South East West Saint San Santa Santo St Mount Lake Port Fort Great Little "  # noqa: SIM905
    "Upper Lower Royal Golden Grand Long".split()
)
_SIGN_OFFS = frozenset(
    ["regards", "kind regards", "best regards", "cheers", "best", "thanks", "thank you",
     "sincerely", "thx", "best wishes", "love", "grüße", "gruß", "cordialement", "saludos",
     "saluti", "groeten", "un abrazo", "ciao"]
)  # fmt: skip
_STRONG_SPEECH_AFTER = re.compile(
    r"\s(?:said|says|wrote|writes|told|asked|mentioned|replied|emailed|texted|agreed|"
    r"confirmed)\b"
)
# Who speaks in a transcript besides people, and listed names too (Agent, Bot, Doctor)
_ROLE_WORDS = frozenset(
    "Agent Bot Doctor User System Assistant Support Customer Client Operator Admin Host "  # noqa: SIM905
    "Guest Caller Staff Driver Courier Nurse".split()
)
# A name alone on a line (a signature) or before a colon at a line's start (a chat).
_LINE_END = re.compile(r"[ \t]*[!.]?[ \t]*(?:\n|$)")
# a line's speaker: "Tesfaye: the parcel is damaged" (not a field and its figure: "Ubuntu:
# 22.04", "Debian: 12")
_SPEAKER = re.compile(r":[ \t]+(?!\d)")


def _title_before(before: str) -> bool:
    if not before.endswith(" "):
        return False
    words = before.split()
    return bool(words) and words[-1].rstrip(".").lower() in _TITLE_WORDS


@cache
def gazetteer() -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    data = gazetteer_file.read()
    # every name also without its diacritics (Nguyễn and Nguyen, Adéyẹmí and Adeyemi)
    given = frozenset(_with_folded(data["given"])) - _NOT_A_START - _NOT_A_NAME - _GREETINGS
    family = frozenset(_with_folded(data["family"])) - _NOT_A_NAME
    suffixes = frozenset(s.lower() for s in data["street_suffixes"]) | _EXTRA_SUFFIXES
    prefixes = frozenset(s.lower() for s in data["street_prefixes"]) | _EXTRA_PREFIXES
    return given, family, suffixes, prefixes


class WordSet:
    """A set of words kept as the sorted hashes of the words (8 bytes a word, where a set of
    str holds about 100): the lexicon's 170,000 words took 19 MiB of every agent as sets.
    ``word in words`` hashes the word (Python's own, cached in the str) and bisects; two
    words with one 64-bit hash would make the second look listed, which at this size has a
    chance of about 1 in 10^9."""

    __slots__ = ("_hashes",)

    def __init__(self, words: Iterable[str]) -> None:
        self._hashes = array("q", sorted({hash(w) for w in words}))

    def __contains__(self, word: object) -> bool:
        h = hash(word)
        at = bisect_left(self._hashes, h)
        return at < len(self._hashes) and self._hashes[at] == h

    def __len__(self) -> int:
        return len(self._hashes)


class Lexicon(NamedTuple):
    """What a capitalised word in no name list may be instead: an English word or a place."""

    dictionary: WordSet  # lower-case dictionary words (invoice, support, banana)
    frequent: WordSet  # lower-case words frequent in English text (email, tokyo)
    places: WordSet  # place names of one word, as written (Lagos, Ibadan, Zaragoza)
    foreign: WordSet  # lower-case frequent words of other languages (miete, factura)


@cache
def lexicon() -> Lexicon:
    data = gazetteer_file.read()
    return Lexicon(
        WordSet(data.get("dictionary_words", ())),
        WordSet(data.get("frequent_words", ())),
        WordSet(_with_folded([p for p in data.get("places", ()) if " " not in p])),
        WordSet(data.get("foreign_words", ())),
    )


@lru_cache(maxsize=65536)
def _unlisted(word: str, strict: bool) -> bool:
    """:func:`_unlisted_name` against the lexicon, remembered per word."""
    return _unlisted_name(word, lexicon(), strict)


def _unlisted_name(word: str, lex: Lexicon, strict: bool = False) -> bool:
    """A capitalised word in no name list that is no English word, no place and no word of
    the lists above: what a name nobody listed looks like (Bolanle, Zbigniew, Kazuyoshi).
    ``strict``: no frequent word of another language either (Miete, Incrocio)."""
    if not (word[0].isupper() and len(word) >= 2):
        return False
    parts = word.split("-")
    if not all(p[:1].isupper() and p[1:].isalpha() and p[1:].islower() for p in parts if p):
        # (a Korean given name's second syllable is written in lower case: Ji-woo)
        if not (len(parts) == 2 and parts[1].isalpha() and parts[1].islower()):
            return False
        if not (parts[0][1:].islower() and korean_shaped(word)):
            return False
    low = fold(word).lower()
    return (
        low not in lex.dictionary
        and low not in lex.frequent
        and not _known(word, lex.places)
        and word not in _NOT_A_NAME
        and word not in _NOT_A_START
        and word not in _SHAPED_NOT_NAMES
        and word not in _PLACE_WORDS
        and word not in _PLACE_AFTER
        and low not in _TITLE_WORDS  # Khun, Pak, Sheikh: the name follows
        # (Cyrillic words always: no English list says what they are; й is no и there)
        and not (
            (strict or "\u0400" <= low[:1] <= "\u04ff")
            and (low in lex.foreign or word.lower() in lex.foreign)
        )
        and not _demonym(word, lex)
        and not _english_compound(low, lex)
    )


def _english_compound(low: str, lex: Lexicon) -> bool:
    """Two English words of four letters or more run together (tunewave, movewell,
    brightpath, quickbooks): how brands and products are named. About one listed name in
    200 splits so (Rosemary, Underwood): a name in no list that does is left to its cues."""
    if len(low) < 8 or not low.isascii():
        return False
    for at in range(4, len(low) - 3):
        head, tail = low[:at], low[at:]
        if (head in lex.dictionary or head in lex.frequent) and (
            tail in lex.dictionary or tail in lex.frequent
        ):
            return True
    return False


_DEMONYM_ENDINGS = (("ian", "ia"), ("an", "a"), ("an", ""), ("ese", ""), ("ese", "a"), ("i", ""))


def _demonym(word: str, lex: Lexicon) -> bool:
    """A people's or a language's word made from a place's name (Rwandan, Nigerian,
    Togolese, Iraqi): no one's name either."""
    for ending, back in _DEMONYM_ENDINGS:
        if (
            word.endswith(ending)
            and len(word) > len(ending) + 2
            and _known(word[: -len(ending)] + back, lex.places)
        ):
            return True
    return False


# Words after which a capitalised word is a place, a thing or a brand more often than a
# person: prepositions of place (English, and de/di/du of street and place names), articles
# and determiners ("the Debian packages", "my Ubuntu server", "a Roth IRA").
_NOT_BEFORE_A_NAME = frozenset(
    "in at from near into around across via of through toward towards within outside inside "  # noqa: SIM905
    "visit visited visiting visits live lives lived living based located flew fly flying "
    "moved move headquartered born de del della di du da des la le los las "
    "the a an this that these those my your our their its his her every each any some no "
    "which what whose".split()
)
_WORD_BEFORE = re.compile(r"([^\W\d_]+)[ \t]+\Z")


def _word_before(before: str) -> str | None:
    """The lower-case word just before a word in running text (None after punctuation, a
    capitalised word or a line's start)."""
    if not before.endswith((" ", "\t")) or not before.rstrip(" \t")[-1:].islower():
        return None  # (most words: after punctuation or a capitalised word)
    m = _WORD_BEFORE.search(before)
    if m is None or not m.group(1).islower():
        return None
    return m.group(1)


def _last_word(before: str) -> str | None:
    """The word just before a word, in any case (None after punctuation or a line's start)."""
    m = _WORD_BEFORE.search(before)
    return None if m is None else m.group(1)


def fold(word: str) -> str:
    """The word without combining marks (tones, dots below, accents): Adéyẹmí -> Adeyemi."""
    if word.isascii():
        return word
    return "".join(
        c for c in unicodedata.normalize("NFD", word) if not unicodedata.combining(c)
    ).replace("ı", "i")


def _with_folded(words: list[str]) -> set[str]:
    out = set(words)
    out.update(fold(w) for w in words)
    return out


def _known(word: str, names: frozenset[str] | WordSet) -> bool:
    return (
        word in names
        or (not word.isascii() and fold(word) in names)
        or ("\u0400" <= word[:1] <= "\u04ff" and _declined(word, names))
    )


# Russian and Ukrainian names change their ending with their case (Смирнову, Игорем,
# Дмитрию, Кузнецовой, Зарецкого): each case ending and the nominative endings it may
# stand for, longest first.
_CASE_ENDINGS = (
    ("ого", ("ий", "ой", "ый")), ("ому", ("ий", "ой", "ый")), ("ему", ("ий",)),
    ("ием", ("ий",)), ("ым", ("", "ый")), ("им", ("ий",)), ("ой", ("а", "ая", "")),
    ("ою", ("а",)), ("ей", ("я", "ь")), ("ем", ("ь", "й")), ("ом", ("",)),
    ("ию", ("ий", "ия")), ("ия", ("ий",)), ("ии", ("ий", "ия")), ("ую", ("ая",)),
    ("у", ("", "а")), ("ю", ("ь", "я", "й")), ("а", ("", "ь")), ("я", ("ь", "й")),
    ("е", ("", "а", "я", "ь")), ("и", ("а", "я", "ь")), ("ы", ("а",)),
)  # fmt: skip


@lru_cache(maxsize=65536)
def _declined(word: str, names: frozenset[str] | WordSet) -> bool:
    """A Cyrillic name in another case than the nominative: Смирнову is Смирнов's."""
    for ending, bases in _CASE_ENDINGS:
        if word.endswith(ending) and len(word) - len(ending) >= 2:
            stem = word[: -len(ending)]
            if any(stem + base in names for base in bases):
                return True
    return False


def find_persons(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    spans = list(_latin_persons(text))
    yield from spans
    if spans:
        yield from _list_mates(text, spans)
    if ":" in text:
        yield from _labelled_capitals(text)
    if "@" in text:
        yield from _mentions(text)
    if ". " in text:
        yield from _initialled(text)
    if ", " in text and ":" in text:
        yield from _last_first_speakers(text)
    yield from find_script_persons(text, found)


# A chat line's speaker written as a directory writes names: "Mekonnen, Tesfaye: the parcel"
_LAST_FIRST_SPEAKER = re.compile(r"([A-Z][\w'\u2019-]+), ([A-Z][\w'\u2019-]+):[ \t]+(?!\d)")


def _last_first_speakers(text: str) -> Iterator[Span]:
    """Both words of a line-opening "Last, First:" whose words are each a listed name or a
    word in no list that is no English word or place; tried at line starts only."""
    starts = [0]
    at = text.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    for m in finditer_from(_LAST_FIRST_SPEAKER, text, starts):
        if all(_label_name(m.group(k)) for k in (1, 2)):
            yield Span(m.start(1), m.end(1), PERSON)
            yield Span(m.start(2), m.end(2), PERSON)


# Initials, then a family name: "J. Smith", "N. Okafor", "J. R. R. Tolkien" (the capitalised
# runs end at an initial's dot, so a name written so was found by its initial alone, or not)
_INITIALLED = re.compile(
    rf"(?:[{_UPPER}]\. ?){{1,3}}([{_UPPER}][\w'\u2019]+(?:-[{_UPPER}][\w'\u2019]+)?)(?![\w'-])"
)


def _initialled(text: str) -> Iterator[Span]:
    """_INITIALLED's names whose word is a listed name, or in no list and shaped or likely
    like one; tried only at a capital before ". " that starts a word."""
    given, family, _, _ = gazetteer()
    starts = []
    at = text.find(". ")
    while at >= 1:
        k = at - 1
        if text[k].isupper() and (k == 0 or not (text[k - 1].isalnum() or text[k - 1] in ".'-")):
            starts.append(k)
        at = text.find(". ", at + 2)
    for m in finditer_from(_INITIALLED, text, starts):
        word = m.group(1)
        if word in _NOT_A_NAME or word in _ROLE_WORDS or word in _NO_NAME_VALUES:
            continue
        if (
            _known(word, family)
            or _known(word, given)
            or (
                _unlisted(word, True)
                and (name_shaped(word) or name_likeness(word) >= NAME_LIKENESS)
            )
        ):
            yield Span(m.start(), m.end(), PERSON)


# The next word of a list after a word (", Thandiwe", " and Bongani"), and the one before
_LIST_NEXT = re.compile(r"(?:, |,? (?:and|or|&) )([A-Z][\w'\u2019-]*)(?![\w'-])")
_LIST_PREVIOUS = re.compile(r"(?<![\w'-])([A-Z][\w'\u2019-]*)(?:, |,? (?:and|or|&) )\Z")


def _list_mates(text: str, spans: list[Span]) -> Iterator[Span]:
    """The other words of a list one of whose words is a name found (Sipho, Thandiwe and
    Bongani): each a plain name, listed or in no list, that is no English word, place or
    common word that is a name too (Faith, Hope); read from each one-word name found
    outwards, not by a pattern over the whole text."""
    given, family, _, _ = gazetteer()
    found = {(s.start, s.end) for s in spans}
    seen: set[tuple[int, int]] = set()
    for s in spans:
        if " " in text[s.start : s.end]:
            continue
        mates: list[tuple[int, int]] = []
        at = s.end
        while (m := _LIST_NEXT.match(text, at)) is not None and len(mates) < 8:
            mates.append(m.span(1))
            at = m.end(1)
        at = s.start
        while (m := _LIST_PREVIOUS.search(text, max(0, at - 40), at)) is not None:
            mates.append(m.span(1))
            at = m.start(1)
            if len(mates) >= 16:
                break
        for a, b in mates:
            if (a, b) in found or (a, b) in seen:
                continue
            seen.add((a, b))
            word = text[a:b]
            if _single_in_running_text(word, _known(word, given), family):
                yield Span(a, b, PERSON)


def _latin_persons(text: str) -> Iterator[Span]:
    """Names found by the capitalised-word rules (Latin, Cyrillic and Greek scripts)."""
    given, family, _, _ = gazetteer()
    for m in _CAP_RUN.finditer(text):
        words = m.group().split(" ")
        offsets = []
        pos = m.start()
        for w in words:
            offsets.append(pos)
            pos += len(w) + 1
        i = 0
        n = len(words)
        while i < n:
            w = words[i]
            # capitalised (a capital first, not all capitals; or one capital), written inline:
            # the loop's most frequent check
            if (
                not ((w[0].isupper() and not w.isupper()) or (len(w) == 1 and w.isupper()))
                or (w in _NOT_A_NAME and not _vietnamese_given(words, i, i + 2))  # Le Van An
                or w in _GREETINGS
            ):
                i += 1
                continue
            before = text[max(0, offsets[i] - 30) : offsets[i]]
            first = w.partition("-")[0]
            if "-" in w and w.rsplit("-", 1)[1].lower() in _HONORIFIC_SUFFIXES and j_ok(w):
                base = w.rsplit("-", 1)[0]
                yield Span(offsets[i], offsets[i] + len(base), PERSON)  # Tanaka-san
                i += 1
                continue
            j = i + 1
            # the name's further words: particles and capitalised words, at most three more
            while j < n and j - i <= 3:
                nxt = words[j]
                if nxt in _PARTICLES:
                    j += 1
                    continue
                if len(nxt) == 2 and nxt[1] == "." and _INITIAL.fullmatch(nxt):
                    j += 1
                    continue
                if not (
                    (nxt[0].isupper() and not nxt.isupper()) or (len(nxt) == 1 and nxt.isupper())
                ) or (nxt in _NOT_A_NAME and not _vietnamese_given(words, i, j)):
                    break
                j += 1
            while j > i + 1 and words[j - 1] in _PARTICLES:
                j -= 1
            known_first = _known(first, given)
            if (
                not known_first
                and first in _NOT_A_START
                and first not in _PLACE_WORDS
                and j > i + 1
                and words[i + 1] in family
                and words[i + 1] not in _NOT_A_START
            ):
                known_first = True  # Mark Haas, Amber Huff: a common word, then a family name
            if (
                words[j - 1] in _PLACE_AFTER
                and (words[j - 1] not in _SURNAME_PLACE_WORDS or words[j - 1] not in family)
            ) or (  # (the pattern starts with a comma: looked at only after one)
                text.startswith(",", run_end := offsets[j - 1] + len(words[j - 1]))
                and _PLACE_AFTER_RE.match(text, run_end)
            ):
                i = j  # Ho Chi Minh City, Ben Nghe Ward, Petaling Jaya, Selangor: a place
                continue
            if (
                (known_first and j > i + 1 and _surnameish(words[i + 1 : j], family))
                or (j >= i + 3 and _vietnamese_given(words, i, i + 2))
                or (j > i + 1 and _pair(w, words[i + 1], before, given, family, words[i + 2 : j]))
                or _title_before(before)
                or (_cue_before(before, _STRONG_CUES) and not _no_value(words, i, j, text, offsets))
                or _after_label(before, words[i:j])
                or _speaking_pair(words[i:j], text, offsets[j - 1] + len(words[j - 1]))
            ):
                end = offsets[j - 1] + len(words[j - 1])
                yield Span(offsets[i], end, PERSON)
                if (
                    j == i + 1
                    and (last_first := _FIRST_AFTER_LAST.match(text, end))
                    and (_cue_before(before, _STRONG_CUES) or _cue_before(before, _LABEL_CUES))
                    and _label_name(last_first.group(1))
                ):
                    yield Span(last_first.start(1), last_first.end(1), PERSON)  # Last, First
                i = j
                continue
            one_end = offsets[i] + len(w)
            if j == i + 1 and w.endswith(("'s", "\u2019s")) and len(w) > 4:
                # a possessive (Mehmet's order): the name without its 's
                w = first = w[:-2]
                one_end -= 2
                known_first = _known(first, given)
            if _lone_name(w, first, known_first, before, text, one_end, given, family):
                yield Span(offsets[i], one_end, PERSON)
            i += 1


# What a form says in place of a name: "Name: Unknown", "Customer: Anonymous"
_NO_NAME_VALUES = frozenset(
    "Unknown None Anonymous Nobody Someone Guest Customer User Redacted Withheld Pending "  # noqa: SIM905
    "Various Null Tbd Tba Unnamed Untitled Blank Empty Private Hidden".split()
)


def _no_value(words: list[str], i: int, j: int, text: str, offsets: list[int]) -> bool:
    """The capitalised words after a strong cue are no name: a placeholder ("Unknown"), a
    letter before a slash (N/A), or a title whose dot ended the run ("Dear Mr. Smith": the
    name after it is found on its own, after its title)."""
    if j != i + 1:
        return False
    w = words[i]
    return (
        w in _NO_NAME_VALUES
        or (len(w) == 1 and text[offsets[i] + 1 : offsets[i] + 2] == "/")
        or (
            w.lower() in _TITLE_WORDS and text[offsets[i] + len(w) : offsets[i] + len(w) + 1] == "."
        )
    )


def _lone_name(
    w: str,
    first: str,
    known_first: bool,
    before: str,
    text: str,
    one_end: int,
    given: frozenset[str],
    family: frozenset[str],
) -> bool:
    """One capitalised word (``w``, its part before a hyphen ``first``) a name on its own, by
    the lists, the words around it (``before`` it, ``text`` from ``one_end`` on) and its
    letters."""
    return bool(
        first not in _NOT_A_NAME
        and first not in _ROLE_WORDS  # Agent: how can I help? (a transcript's role)
        and (
            (
                known_first
                and (
                    _cue_before(before, _CUE_PHRASES)
                    or _SPEECH_AFTER.match(text, one_end)
                    or (
                        (before == "" or before.endswith("\n"))
                        and (_LINE_END.match(text, one_end) or _SPEAKER.match(text, one_end))
                    )
                )
            )
            or (
                first in _NOT_A_START
                and first not in _PLACE_WORDS
                and (
                    _STRONG_SPEECH_AFTER.match(text, one_end)
                    or (before.endswith("\n") and _cue_before(before, _SIGN_OFFS))
                )
            )
            or (
                # a name alone in running text, after a lower-case word that does not
                # lead to places: "spoke with Priya", "forwarded it to Kazuyoshi" (a
                # listed name that is no English word or well-known place, or a
                # name-shaped word in no list that is neither)
                (prev := _word_before(before)) is not None
                and prev not in _NOT_BEFORE_A_NAME
                and _single_in_running_text(w, known_first, family)
            )
            or (
                # a name in no list, shaped like one, where only a person fits:
                # "ask Adaeze", "Thanks, Kazuyoshi", "Oluwaseun said"
                first not in _NOT_A_START
                and first not in _SHAPED_NOT_NAMES
                and name_shaped(w)
                and (
                    _cue_before(before, _PERSON_CUES)
                    or _STRONG_SPEECH_AFTER.match(text, one_end)
                    or (before.endswith("\n") and _cue_before(before, _SIGN_OFFS))
                )
            )
            or (
                # any word in no list where only a person fits: "my colleague Siriporn",
                # "Hi Dobrogost,", "Tesfaye wrote back"
                not known_first and _unlisted_in_person_context(w, before, text, one_end)
            )
            or (
                # a Cyrillic name inside a sentence: Russian and Ukrainian write no other
                # word with a capital there but places and brands ("Звонил Сергей",
                # "звонила Гульнара"): a listed given name, or a word in no list that is
                # no frequent Russian or Ukrainian word (Яндекс, Сбербанк are) nor a place
                "\u0400" <= first[:1] <= "\u04ff"
                and not first.isupper()
                and before != ""
                and not _opens_sentence(before)
                and not before.rstrip(" ").endswith((":", "«", '"', "„", "(", "-", "—"))
                and (
                    _known(first, given)
                    if known_first
                    else _unlisted(w, True) and _last_word(before) not in _CYRILLIC_PLACE_PREPS
                )
            )
            or (
                # a listed given name that is no English word or place opening a
                # sentence or a question, a lower-case word after it: "Mariam paid the
                # deposit", "Ngozi and Emeka", "Is Kwabena still the contact?"
                known_first
                and w == first  # not Per-request
                and _opens_sentence(before)
                and _lower_word_after(text, one_end, first)
                and _single_in_running_text(w, True, family)
                and not _plural_of_a_word(w)  # Mats are provided
            )
        )
    )


# A name in capitals after a label (booking and travel records: "Passenger: MR TESFAYE
# BEKELE", "Guest name: DILNOZA KARIMOVA"): two to four words of capitals, a title before
# them set aside. Found from the runs of capitals, the label looked for just before each.
_CAPITALS_RUN = re.compile(
    r"[A-Z](?<![\w'-][A-Z])[A-Z'\u2019-]+(?:[ \t]+[A-Z][A-Z'\u2019-]+){1,4}(?![\w])"
)
_LABEL_BEFORE = re.compile(
    r"(?i:\b(?:passenger|guest|traveller|traveler|customer|client|recipient|addressee|"
    r"patient|beneficiary|cardholder|card holder|account holder|holder|consignee|"
    r"contact|attn|full name|first name|last name|surname|name)(?:[ \t]+name)?[ \t]*[:：][ \t]*)\Z"
)
_CAPITAL_TITLES = frozenset("MR MRS MS MISS MSTR DR PROF MR. MRS. MS. DR. PROF.".split())  # noqa: SIM905
_NOT_CAPITAL_NAMES = frozenset(
    "N/A NA NONE UNKNOWN TBD TBA NOT GIVEN SEE ABOVE AS".split()  # noqa: SIM905
)


def _labelled_capitals(text: str) -> Iterator[Span]:
    for m in _CAPITALS_RUN.finditer(text):
        if _LABEL_BEFORE.search(text, max(0, m.start() - 40), m.start()) is None:
            continue
        words = m.group().split()
        start = m.start()
        if words[0] in _CAPITAL_TITLES:  # MR TESFAYE BEKELE: the name after the title
            start = text.index(words[1], start + len(words[0]))
            words = words[1:]
        if not 2 <= len(words) <= 4 or any(w in _NOT_CAPITAL_NAMES for w in words):
            continue
        if all(_name_or_unlisted(w.title()) for w in words):  # not CUSTOMER SERVICE
            yield Span(start, m.end(), PERSON)


def _name_or_unlisted(word: str) -> bool:
    """A listed given or family name, or a word in no list (no English word, no place)."""
    given, family, _, _ = gazetteer()
    return _known(word, given) or _known(word, family) or _unlisted(word, True)


# A mention in chat: "@Tesfaye can you check?" (a capitalised handle, not an e-mail address)
_MENTION = re.compile(r"(?<![\w@.])@([A-Z][\w'-]{1,30})(?![\w@.-]*[.@][\w])")


def _mentions(text: str) -> Iterator[Span]:
    for m in _MENTION.finditer(text):
        if _name_or_unlisted(m.group(1)):  # not @Support, @Here
            yield Span(m.start(1), m.end(1), PERSON)


# a sentence's end before a word (and its closing quote or bracket), or a question's
# auxiliary opening one
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d)]?[ \t]+\Z")
_QUESTION_OPENING = re.compile(
    r"(?:\A|[.!?\n][ \t]*)(?:Is|Was|Did|Does|Do|Can|Could|Will|Would|Should|Has|Have|Had|"
    r"May|Might|Shall)[ \t]+\Z"
)
# a lower-case word next (a verb, "and", "is"), after at most a comma
_LOWER_AFTER = re.compile(r",?[ \t]+(?=[^\W\d_])")
# After a Cyrillic name opening a sentence, a verb in the past or third person (Ольга
# оплатила, Тарас написав, Сергей звонит): names there are words too (Вера в лучшее)  # noqa: RUF003
_CYRILLIC_VERB_AFTER = re.compile(
    r",?[ \t]+[а-яёіїєґ'ʼ]{2,}(?:ла|ли|ло|л|ет|ит|ат|ят|ёт|ут|ют|ав|ів|ив)(?![\w])"
)


# Russian and Ukrainian prepositions before places, shops and services, seldom before a
# person: на Озоне, в Телеграме, из Вайлдберриз (not the ones people follow, "at X's")
_CYRILLIC_PLACE_PREPS = frozenset(
    "в во на из изо по под над через около возле при вдоль".split()  # noqa: SIM905
)


def _lower_word_after(text: str, end: int, word: str) -> bool:
    """A lower-case word follows ``word`` (a verb, for a Cyrillic one)."""
    if "\u0400" <= word[:1] <= "\u04ff":
        return _CYRILLIC_VERB_AFTER.match(text, end) is not None
    after = _LOWER_AFTER.match(text, end)
    return after is not None and text[after.end()].islower()


def _unlisted_in_person_context(word: str, before: str, text: str, end: int) -> bool:
    """A word in no list after a cue naming a relation or a greeting, or before past-tense
    speech. After "Hi," the word may open a sentence ("Hi, Spoolbox says"): a name there ends
    its phrase ("Thanks, Tesfaye!")."""
    if not _unlisted(word, True):
        return False
    if _cue_before(before, _RELATION_CUES) or _PAST_SPEECH_AFTER.match(text, end):
        return True
    at_line_start = before == "" or before.endswith("\n")
    if at_line_start and (
        _cue_before(before, _SIGN_OFFS)  # Best,\nGulnara
        or (  # a chat's speaker: "Tesfaye: the parcel is damaged"
            _SPEAKER.match(text, end) is not None
            and (
                name_shaped(word)
                or name_likeness(word) >= NAME_LIKENESS
                # a transcript: the same word speaking on two lines or more
                or text.startswith(f"{word}: ") + text.count(f"\n{word}: ") >= 2
            )
        )
    ):
        return True
    dash = before.rstrip(" ")
    if dash.endswith(("\n\u2014", "\n--")) or dash in ("\u2014", "--"):
        return _LINE_END.match(text, end) is not None  # a signature: "— Tesfaye"
    if (
        _opens_sentence(before)
        and (name_shaped(word) or name_likeness(word) >= NAME_LIKENESS)
        and _PERSON_VERB_AFTER.match(text, end)
    ):
        return True  # Somsak called about the refund, Sokha wants a refund
    return _cue_before(before, _GREETING_CUES) and (
        not before.rstrip(" ").endswith(",") or _PHRASE_END.match(text, end) is not None
    )


def _plural_of_a_word(word: str) -> bool:
    """An English word's plural (Mats, Rosas): a given name only in some lists."""
    low = word.lower()
    return low.endswith("s") and low[:-1] in lexicon().dictionary


_QUESTION_WORDS = frozenset(
    "Is Was Did Does Do Can Could Will Would Should Has Have Had May Might Shall".split()  # noqa: SIM905
)


def _opens_sentence(before: str) -> bool:
    """The word after ``before`` opens a text, a line, a sentence or a question (string
    tests first: the patterns only where the text before ends as they need)."""
    if before == "" or before.endswith("\n"):
        return True
    if not before.endswith((" ", "\t")):
        return False
    last = before.rstrip(" \t")
    if last[-1:] in ".!?\"'\u201d)":
        return _SENTENCE_END.search(before) is not None
    word = last.rpartition(" ")[2].rpartition("\n")[2]
    return word in _QUESTION_WORDS and _QUESTION_OPENING.search(before) is not None


# Vietnamese family names, and the middle names that mark a given name after them
_VIETNAMESE_FAMILY = frozenset(
    "Nguyen Nguyễn Tran Trần Le Lê Pham Phạm Hoang Hoàng Huynh Huỳnh Phan Vu Vũ Vo Võ Dang "  # noqa: SIM905
    "Đặng Bui Bùi Do Đỗ Ho Hồ Ngo Ngô Duong Dương Ly Lý".split()
)
_VIETNAMESE_MIDDLE = frozenset("Van Văn Thi Thị".split())  # noqa: SIM905


def _vietnamese_given(words: list[str], i: int, j: int) -> bool:
    """``words[j]`` is the given name of a Vietnamese name that starts at ``words[i]``, after
    its middle name (Nguyen Van An, Tran Thi Ha): read as a name even where it is also an
    English word (An)."""
    return (
        i + 2 <= j < len(words)
        and words[i] in _VIETNAMESE_FAMILY
        and words[j - 1] in _VIETNAMESE_MIDDLE
        and words[j][:1].isupper()
    )


def _single_in_running_text(word: str, known_given: bool, family: frozenset[str]) -> bool:
    lex = lexicon()
    low = fold(word).lower()
    if known_given or _known(word, family):
        return (
            word not in _NOT_A_START
            and word not in _PLACE_WORDS
            and low not in lex.dictionary
            and not _known(word, lex.places)  # Valencia, Florence, Austin
            and not (low in lex.frequent and not known_given)  # only a family name: English
            and not _demonym(word, lex)
        )
    if name_shaped(word):
        return _unlisted(word, True)
    # a word in no list shaped like no name in particular (Dobrogost, Achterberg): by the
    # letters it is made of, far more like the listed names than like English words
    return _name_like(word) and _unlisted(word, True)


#: a word in no list is read as a name in running text from this mean log-likelihood ratio of
#: its letter trigrams on: held-out listed names score 0.6 or more seven times in ten,
#: English words once in twenty (see :func:`name_likeness`)
NAME_LIKENESS = 0.6


@cache
def _trigram_ratios() -> tuple[dict[str, float], float]:
    """Per letter trigram (of the word, lower case, without marks, between ^ and $), the log
    of how much more often it occurs in the listed names than in English words (add-one
    smoothed), and the ratio of a trigram seen in neither: a naive Bayes model of names,
    built from the gazetteer's lists at warm-up (0.2 s)."""
    data = gazetteer_file.read()
    listed = {
        low
        for w in chain(data["given"], data["family"])
        if len(w) >= 4 and w.isalpha() and w[:1].isupper() and (low := fold(w).lower()).isascii()
    }
    english = {
        w
        for w in chain(data.get("dictionary_words", ()), data.get("frequent_words", ()))
        if len(w) >= 4 and w.isalpha() and w not in listed
    }
    in_names = Counter(g for w in listed for g in _trigrams(w))
    in_words = Counter(g for w in english for g in _trigrams(w))
    names_total, words_total = in_names.total(), in_words.total()
    vocabulary = len(in_names.keys() | in_words.keys())
    unseen = math.log(words_total + vocabulary) - math.log(names_total + vocabulary)
    ratios = {
        g: math.log((in_names[g] + 1) / (names_total + vocabulary))
        - math.log((in_words[g] + 1) / (words_total + vocabulary))
        for g in in_names.keys() | in_words.keys()
    }
    return ratios, unseen


def _trigrams(low: str) -> list[str]:
    w = f"^{low}$"
    return [w[i : i + 3] for i in range(len(w) - 2)]


def _model_letters(word: str) -> str:
    """The word as the name model reads it: lower case, without marks, ł and đ as l and d."""
    return fold(word).lower().replace("ł", "l").replace("đ", "d")


def _name_like(word: str) -> bool:
    """A word of Latin letters, with or without marks (Zdzisław, Şükrü: the letters the name
    model was built from; names in other scripts are read by their own rules), whose letters
    look like a listed name's from :data:`NAME_LIKENESS` on."""
    return _model_letters(word).isascii() and name_likeness(word) >= NAME_LIKENESS


@lru_cache(maxsize=65536)
def name_likeness(word: str) -> float:
    """How much more a word's letters look like a listed name's than an English word's: the
    mean log-likelihood ratio of its trigrams (above 0: more like a name)."""
    ratios, unseen = _trigram_ratios()
    grams = _trigrams(_model_letters(word))
    return sum(ratios.get(g, unseen) for g in grams) / len(grams)


# Cities, countries and brands shaped like names (never a person's name on their own).
_SHAPED_NOT_NAMES = frozenset(
    "Tokyo Osaka Kyoto Kobe Nagoya Yokohama Sapporo Fukuoka Sendai Hiroshima Nara Okinawa "  # noqa: SIM905
    "Lagos Abuja Accra Nairobi Kampala Dakar Kumasi Ibadan Kano Enugu Manila Jakarta Hanoi "
    "Seoul Busan Incheon Daegu Beijing Shanghai Shenzhen Taipei Macau Nanjing Wuhan Xian "
    "Chengdu Guangzhou Hangzhou Tianjin Chongqing Mumbai Chennai Delhi Kolkata Pune Dhaka "
    "Karachi Lahore Kabul Tehran Dubai Doha Riyadh Cairo Moscow Kiev Kyiv Minsk Warsaw "
    "Toyota Honda Mazda Nissan Yamaha Kawasaki Sony Nokia Samsung Hyundai Kia Huawei Xiaomi "
    "Alibaba Tencent Baidu Lenovo Sushi Ramen Tofu Kimono Karaoke Banana Tomato Potato Kitty "
    "Hello Mango Papaya Sudoku Emoji Anime Manga Kimchi Bibimbap Taco Pizza Pasta Salami "
    "Hawaii Nevada Colorado Arizona Montana Alabama Panama Cuba Kenya Ghana Uganda Rwanda "
    "Somalia Nigeria Japan China Korea Malaysia Indonesia Samoa Tonga Fiji Nepal Oman".split()
)
# Cues that name a person's relation to someone: after them any word in no list is a name
# (not "tell", "contact", "called": brands and services follow those too).
_RELATION_CUES = frozenset(
    "colleague|manager|friend|neighbour|neighbor|wife|husband|son|daughter|boss|mom|mum|dad|"  # noqa: SIM905
    "sister|brother|partner|patient|employee|coworker|co-worker|flatmate|roommate|tenant|"
    "landlord|landlady|nephew|niece|cousin|aunt|uncle|grandson|granddaughter|fiancé|fiancée|"
    "girlfriend|boyfriend|teacher|student|carer|caregiver".split("|")
)
# Past-tense speech after a word in no list: a person ("Tesfaye wrote back"); not "says",
# which apps and headers do ("Retry-After says when")
_PAST_SPEECH_AFTER = re.compile(
    r"\s(?:said|wrote|told|asked|mentioned|replied|emailed|texted|agreed|confirmed)\b"
)
# What people do in a sentence that opens with their name, and things seldom do
_PERSON_VERB_AFTER = re.compile(
    r"[ \t]+(?:called|phoned|rang|emailed|texted|messaged|wrote|said|asked|replied|wants|"
    r"wanted|signed|visited|came|arrived|thinks|thought|feels|felt)\b"
)
_PHRASE_END = re.compile(r"[ \t]*(?:[,!.?;:)]|\n|\Z)")
# Greetings and thanks: a word in no list after them is a name ("Hi Dobrogost,", "Thanks,
# Tesfaye!"), as a brand or a team is rarely greeted by its name alone.
_GREETING_CUES = frozenset(
    "dear|hi|hello|hey|thanks|thank you|cheers|hiya|good morning|good afternoon|"  # noqa: SIM905
    "good evening|greetings".split("|")
) | frozenset(_FOREIGN_GREETINGS.split("|"))
# Cues that introduce a person and nothing else (not "from", "to", "with": places follow them).
_PERSON_CUES = frozenset(
    "dear|hi|hello|hey|thanks|thank you|cc|ask|tell|call|email|e-mail|ping|contact|meet|met|"  # noqa: SIM905
    "named|called|name is|my name is|i am|i'm|this is|signed|signed by|patient|customer|client|"
    "employee|colleague|manager|friend|neighbour|neighbor|wife|husband|son|daughter|boss|mom|"
    "mum|dad|sister|brother|partner|attn|regards|cheers|best|sincerely|thx".split("|")
)
_SLAVIC_FAMILY = re.compile(
    r"(?:ov|ova|ev|eva|in|ina|sky|skiy|skii|skaya|ska|enko|chuk|czuk|uk|yuk|ik|wicz|vich|"
    r"ович|евич|ов|ова|ев|ева|ин|ина|ский|ская|енко|чук|юк)$"
)


# Words that make the capitalised run before them a place or an organisation, not a person.
_PLACE_AFTER = frozenset(
    "City Ward District Province Regency Station Tower Mall Centre Center Airport Hotel "  # noqa: SIM905
    "Market Bridge Lake River Island Beach Temple Mosque Church Cathedral Square Plaza "
    "Building Village Town County State Quarter Borough Barangay Subdistrict Prefecture "
    "Township Municipality Commune Precinct Campus College Institute Stadium Museum Gardens "
    "Road Street Avenue Lane Boulevard Highway Port Harbour Harbor Valley Hills Heights "
    "Jaya Pusat Selatan Utara Barat Timur".split()
)
# Place words that are also common family names (Nicole Ward): a place only when not known.
_SURNAME_PLACE_WORDS = frozenset(
    "Ward Street Lake River Hill Hills Hall Bridge Church Park Field Wood Brook Town Beach "  # noqa: SIM905
    "Square Market Port Valley Heights Gardens Lane".split()
)
_PLACE_AFTER_RE = re.compile(
    r",\s(?:Selangor|Johor|Penang|Sabah|Sarawak|Jakarta|Bangkok|Manila|Cebu|Hanoi|Singapore|"
    r"Kuala Lumpur|Metro Manila)\b"
)


_PATRONYMIC = re.compile(
    r"(?:ovich|evich|ovna|evna|ichna|інічна|івна"
    r"|(?:ович|евич)(?:а|у|ем|е)?|(?:овн|евн|ичн)(?:а|ы|е|у|ой|ою))$"  # Сергеевичу, Петровной
)
_CYRILLIC_WORD = re.compile(r"[А-ЯЁЇІЄҐ][а-яёїієґ'-]+")


@cache
def _east_asian_family() -> frozenset[str]:
    data = gazetteer_file.read()
    return frozenset(data.get("east_asian_family", ()))


def j_ok(word: str) -> bool:
    """The part before an honorific suffix is a capitalised word (Tanaka-san, not x-san)."""
    base = word.rsplit("-", 1)[0]
    return len(base) >= 2 and base[0].isupper() and base.replace("-", "")[1:].islower()


def _pair(
    a: str,
    b: str,
    before: str,
    given: frozenset[str],
    family: frozenset[str],
    rest: list[str] | tuple[str, ...] = (),
) -> bool:
    """Two words that make a name without a known given name first (the words after them,
    ``rest``, in the same capitalised run): by the lists (:func:`_listed_pair`), or with a
    word in no list (:func:`_unlisted_pair`); not two places side by side (Nairobi Kisumu,
    Osaka Kobe), unless the first is a given name (Paris Hilton)."""
    if _two_places(a, b, given):
        return False
    return _listed_pair(a, b, before, given, family) or _unlisted_pair(a, b, before, family, rest)


def _two_places(a: str, b: str, given: frozenset[str]) -> bool:
    places = lexicon().places
    return _known(a, places) and _known(b, places) and not _known(a, given)


def _unlisted_pair(
    a: str, b: str, before: str, family: frozenset[str], rest: list[str] | tuple[str, ...]
) -> bool:
    """A listed family name and a word in no list, in either order (``Okafor Bolanle``,
    ``Bolanle Adeyemi``), or two words in no list, one name-shaped or after a lower-case word
    (``Thitirat Jirapat``); never after an article, a determiner or a preposition of place
    (``the Viet Cong``), nor in a run that goes on with an ordinary or street word
    (``Kestrel Way``, ``Movewell Physio``)."""
    if b in _NOT_A_NAME or a in _NOT_A_START or b in _NOT_A_START or a in _PLACE_WORDS:
        return False
    last = _last_word(before)
    if not (
        (_known(a, family) and a not in _SURNAME_PLACE_WORDS and _unlisted(b, False))
        or (
            _known(b, family)
            and b not in _SURNAME_PLACE_WORDS
            and _unlisted(a, False)
            # an English -ing word has a pinyin shape (Mailing List): only before pinyin
            and not (pinyin_only(a) and not pinyin_shaped(b))
        )
        or (
            _unlisted(a, True)
            and _unlisted(b, True)
            and (
                name_shaped(a)
                or name_shaped(b)
                or (last is not None and last.islower())
                or _name_like(a)
                or _name_like(b)
            )
        )
    ):
        return False
    # not after an article, a determiner or a preposition of place, in any case (The Viet Cong)
    not_after = last is not None and last.lower() in _NOT_BEFORE_A_NAME
    return not not_after and _run_of_names(b, rest, lexicon())


def _listed_pair(
    a: str, b: str, before: str, given: frozenset[str], family: frozenset[str]
) -> bool:
    """A known family name and a given name (known or name-shaped: ``Wang Xiuying``,
    ``Kim Min-jun``), a name-shaped given name and a known family name (``Oluwaseun
    Adeyemi``), or two name-shaped words of the same syllabic system after a cue or long
    enough not to be common words."""
    if not (b[0].isupper() and b[1:].replace("-", "").islower()):
        return False
    if f"{a} {b}" in _PLACES:
        return False
    if "-" in b and korean_shaped(b) and a in family:
        return True  # Park Seo-yeon, Lee Ji-eun: a hyphenated Korean given name
    if "-" in a and korean_shaped(a) and b in _east_asian_family():
        return True  # Hyun-woo Park, Ji-eun Lee: the same, family name last
    if b in _NOT_A_NAME or a in _NOT_A_START or b in _NOT_A_START or a in _PLACE_WORDS:
        return False
    a_family = _known(a, family)
    b_known = _known(b, given) or _known(b.split("-")[0], given) or _known(b, family)
    if a_family and (b_known or name_shaped(b)):
        return True
    if b in _east_asian_family() and name_shaped(a) and a not in _SHAPED_NOT_NAMES:
        return True  # Minjun Kim, Haruto Sato, Xiuying Wang: a given name, then the family's
    if _known(b, family) and not _known(b, given) and name_shaped(a):
        # a pinyin-only shape (English -ing words have it) only before a pinyin surname
        return not pinyin_only(a) or pinyin_shaped(b)
    if _SLAVIC_FAMILY.search(a) and b_known:
        return True  # Shestakova Alyona, Шестакова Алёна: a Slavic family name first
    if _PATRONYMIC.search(b):
        return True  # Ivan Petrovich, Алёна Викторовна: a patronymic follows a given name
    if _CYRILLIC_WORD.fullmatch(a) and _CYRILLIC_WORD.fullmatch(b) and _SLAVIC_FAMILY.search(a):
        return True  # Шестакова Алёна: both Cyrillic, the first a family name by its ending
    if _known(a, given) and name_shaped(b):
        return True
    if (
        (name_shaped(a) or name_shaped(b))
        and a not in _SHAPED_NOT_NAMES
        and _cue_before(before, _PERSON_CUES)
    ):
        return True  # ask Adaeze Nwachukwu, customer Somchai Jaidee
    if name_shaped(a) and name_shaped(b):
        if _cue_before(before, _CUE_PHRASES):
            return True
        return (
            len(a) >= 5
            and len(b) >= 5
            and (
                (romaji_shaped(a) and romaji_shaped(b)) or (open_syllabled(a) and open_syllabled(b))
            )
        )
    return False


def _run_of_names(b: str, rest: list[str] | tuple[str, ...], lex: Lexicon) -> bool:
    """No word after the first is an ordinary word that is in no name list, or a street word:
    Marlow Block Management, Pennant Car Hire, Orchard Mews, Corran Esplanade are no one's
    (Priyanka Shah is someone's: shah is a dictionary word and a family name)."""
    given, family, suffixes, _ = gazetteer()
    for w in (b, *rest):
        low = fold(w).lower()
        if low in suffixes or (
            (low in lex.dictionary or low in lex.frequent)
            and not _known(w, given)
            and not _known(w, family)
        ):
            return False
    return True


# Places of two words whose first word is also a name somewhere (never a person's name).
_PLACES = frozenset(
    [
        "Ha Noi", "Da Nang", "Hai Phong", "Can Tho", "Hue City", "Hong Kong", "Kuala Lumpur",
        "Phnom Penh", "Chiang Mai", "Chiang Rai", "Abu Dhabi", "Sri Lanka", "Tel Aviv",
        "San Jose", "Costa Rica", "Puerto Rico", "Buenos Aires", "Santo Domingo", "Port Louis",
        "Dar Es", "Addis Ababa", "Kota Kinabalu", "Johor Bahru", "Ipoh City", "Bandar Seri",
        "Cebu City", "Quezon City", "Davao City", "Makati City", "Pasig City", "Ho Chi",
        "Nha Trang", "Vung Tau", "Dong Nai", "Binh Duong", "Hai Ba", "Ba Dinh", "Hoan Kiem",
    ]
)  # fmt: skip


def _surnameish(words: list[str], family: frozenset[str]) -> bool:
    """The words after a known given name look like a family name (known, or a plain name)."""
    for w in words:
        if w in _PARTICLES or _INITIAL.fullmatch(w):
            continue
        if _known(w.split("-")[0], family):
            return True
        if not all(p[:1].isupper() and (p[1:].islower() or not p[1:]) for p in w.split("-")):
            return False  # Smith, Al-Mansouri, Nguyen-Tran; not ACME or eBay
        if len(w) < 2:
            return False
    return True


# --------------------------------------------------------------------------- addresses

_EXTRA_SUFFIXES = frozenset(
    [
        "street",
        "st",
        "st.",
        "avenue",
        "ave",
        "ave.",
        "road",
        "rd",
        "rd.",
        "boulevard",
        "blvd",
        "blvd.",
        "lane",
        "ln",
        "ln.",
        "drive",
        "dr",
        "dr.",
        "court",
        "ct",
        "ct.",
        "place",
        "pl",
        "pl.",
        "terrace",
        "way",
        "square",
        "sq",
        "circle",
        "cir",
        "highway",
        "hwy",
        "parkway",
        "pkwy",
        "crescent",
        "close",
        "gardens",
        "grove",
        "mews",
        "row",
        "walk",
        # South Asian streets and localities (Gandhi Nagar, MG Marg, 5th Cross)
        "nagar",
        "marg",
        "colony",
        "layout",
        "chowk",
        "bazaar",
        "bazar",
        "gali",
        "enclave",
        "vihar",
        "salai",
        "cross",
        "main",
        # Korean, Japanese romanized road words written as a word
        "daero",
        "dori",
        # Slavic types written after the name (Nevsky prospekt)
        "ulitsa",
        "prospekt",
        "pereulok",
        "naberezhnaya",
        "shosse",
        "bulvar",
        "ploshchad",
        "улица",
        "проспект",
        "переулок",
        "набережная",
        "шоссе",
        "бульвар",
        "площадь",
        "вулиця",
        "ул.",
        "пр.",
        "просп.",
        "пер.",
        "наб.",
        # Turkish, Hungarian, Finnish, Scandinavian street words after the name
        "sokak",
        "sokağı",
        "caddesi",
        "cadde",
        "bulvarı",
        "utca",
        "út",
        "tér",
        "katu",
        "tie",
        "gatan",
        "vägen",
        "gate",
        "veien",
        "vej",
        "gade",
    ]
)
_EXTRA_PREFIXES = frozenset(
    [
        "rue",
        "avenue",
        "av.",
        "boulevard",
        "bd",
        "bd.",
        "place",
        "chemin",
        "allée",
        "impasse",
        "quai",
        "route",
        "cours",
        "square",
        "via",
        "viale",
        "piazza",
        "piazzale",
        "corso",
        "vicolo",
        "largo",
        "strada",
        "contrada",
        "borgo",
        "calle",
        "avenida",
        "av",
        "paseo",
        "plaza",
        "camino",
        "carrer",
        "carretera",
        "ronda",
        "travesía",
        "rua",
        "travessa",
        "praça",
        "estrada",
        "alameda",
        "largo",
        "rambla",
        # Slavic, South-East Asian, Balkan, Romanian, Latin American types before the name
        "ul.",
        "ul",
        "ulica",
        "ulice",
        "al.",
        "aleja",
        "pl.",
        "plac",
        "os.",
        "osiedle",
        "ulitsa",
        "prospekt",
        "pr.",
        "prosp.",
        "per.",
        "nab.",
        "ул.",
        "улица",
        "пр.",
        "просп.",
        "проспект",
        "пер.",
        "переулок",
        "наб.",
        "набережная",
        "бул.",
        "бульвар",
        "ш.",
        "шоссе",
        "пл.",
        "площадь",
        "вул.",
        "вулиця",
        "просп",
        "бул",
        "jalan",
        "jl.",
        "jl",
        "jln",
        "jln.",
        "lorong",
        "persiaran",
        "lebuh",
        "soi",
        "thanon",
        "đường",
        "phố",
        "duong",
        "pho",
        "ngõ",
        "hẻm",
        "barangay",
        "brgy.",
        "strada",
        "str.",
        "bulevardul",
        "bd.",
        "calea",
        "rruga",
        "carrera",
        "cra.",
        "jr.",
        "jirón",
        "avenue",
        "sector",
    ]
)
# German and Dutch streets are one word ending in the street word.
_COMPOUND_ENDINGS = COMPOUND_ENDINGS  # the alternation, in patterns below
_DIGIT = re.compile(r"\d")
_NOT_A_STREET = frozenset(
    [
        "String",
        "Spring",
        "Bring",
        "During",
        "Offering",
        "Ring",
        "Keyring",
        "Earring",
        "Sparring",
        "Morning",
        "Evening",
        "Nothing",
        "Something",
        "Anything",
        "Everything",
        "Thing",
        "Wing",
        "King",
        "Sing",
        "Swing",
        "Sting",
        "Boring",
        "Spark",
        "Park",
        "Keypad",
        "Notepad",
        "Trackpad",
        "Launchpad",
        "Way",
        "Hof",
        "Baan",
        "Markt",
        "Weg",
    ]
)
_NUM_REST = r"(?:\s?[a-zA-Z](?![\w]))?(?:[-/]\d{1,5}[a-zA-Z]?)?"
_NUM = rf"\d{{1,5}}{_NUM_REST}"
_UNIT = (
    r"(?:,?\s(?:кв\.?|корп\.?|стр\.?|kv\.?|m\.|lok\.|Block|Blk\.?|Lot|Lantai|Tầng|Floor|Piano|Apt\.?|Apartment|Suite|Ste\.?|Unit|Flat|Floor|Fl\.?|Room|Rm\.?|#|Piso|"
    r"Puerta|Appartamento|Interno|Int\.|Scala|Wohnung|Whg\.?|Etage|Bus|App\.?|Bâtiment|"
    r"Bât\.?|Escalera|Esc\.?)\s?#?\d{1,5}[A-Za-z]?(?:º|ª)?)"
)
_CITY = rf"[{_UPPER}][\w'\u2019-]*(?:[ -](?:[{_UPPER}]|d[ie]\b)[\w'\u2019-]*){{0,3}}"
_POST_TAIL = (
    r"(?:,?\s?(?:"
    # 10115 Berlin; 13031, Arborio (VC)
    rf"\d{{4,5}}(?:-\d{{3,4}})?,?\s{_CITY}(?:\s\([A-Z]{{2}}\))?"
    rf"|{_CITY},\s[A-Z]{{2}}\s\d{{5}}(?:-\d{{4}})?"  # Springfield, IL 62704
    rf"|{_CITY},?\s\d{{4,5}}(?!\d)"  # Albacete, 43568
    rf"|{_CITY},?\s[A-Z]{{1,2}}\d[A-Z\d]?\s?\d[A-Z]{{2}}"  # London NW1 6XE
    rf"|\d{{4}}\s?[A-Z]{{2}},?\s{_CITY}"  # 2743 UB Anerveen
    rf"|{_CITY},?\s\d{{6}}(?!\d)"  # Москва, 125009; Bengaluru 560001
    rf"|{_CITY},?\s\d{{3}}\s\d{{3}}(?!\d)"  # Mumbai 400 001
    rf"|\d{{6}},?\s{_CITY}"  # 125009 Москва
    rf"|\d{{2}}-\d{{3}},?\s{_CITY}"  # 00-950 Warszawa
    rf"|{_CITY},?\s\d{{3}}-\d{{4}}(?!\d)"  # Nagoya 460-0008
    rf"|{_CITY},?\s\d{{5}}-\d{{3}}(?!\d)"  # São Paulo, 01310-100
    rf"|{_CITY},?\s[A-Z]\d[A-Z]\s?\d[A-Z]\d"  # Toronto, ON M5V 2T6 (without the province)
    r"))?"
)
_NAME_WORD = r"[^\W\d_][\w'\u2019.-]*"


@cache
def _address_patterns() -> tuple[re.Pattern[str], ...]:
    _, _, suffixes, prefixes = gazetteer()

    suf, pre = trie_regex(suffixes), trie_regex(prefixes)
    number_first = re.compile(
        rf"\d(?<![\w.,/-][\s\S])\d{{0,4}}{_NUM_REST},?\s(?:{_NAME_WORD}\s){{0,3}}(?i:{suf})(?![\w])\.?(?:\s(?:N|S|E|W|NE|NW|SE|SW)(?![\w]))?{_UNIT}?{_POST_TAIL}"
    )
    prefix_first = re.compile(
        rf"(?<![\w-])(?:{_NUM},?\s)?(?i:{pre})(?![\w])\s"
        rf"(?:(?:de|del|de la|des|du|d'|di|della|delle|dei|do|da|dos|das)\s?)?"
        rf"{_NAME_WORD}(?:\s(?:de|del|la|di|della|y|e|von|van)?\s?{_NAME_WORD}){{0,3}}"
        rf",?\s(?:{_NUMBER_WORD})?{_NUM}(?![\w]){_UNIT}?{_POST_TAIL}"
    )
    prefix_numbered = re.compile(  # 23, rue Victoire Perrier (the number first, no number after)
        rf"(?<![\w.,/-])\d{{1,5}}(?:\s?(?:bis|ter))?,?\s(?i:{pre})(?![\w])\s"
        rf"(?:(?:de|du|des|de la|d')\s?)?{_NAME_WORD}(?:\s{_NAME_WORD}){{0,3}}{_UNIT}?{_POST_TAIL}"
    )
    type_after = re.compile(  # Tverskaya ulitsa 7; Тверская ул., д. 7; Atatürk Caddesi No. 5
        rf"(?<![\w-])[{_UPPER}][\w'\u2019.-]*(?:\s{_NAME_WORD}){{0,2}}\s(?i:{trie_regex(_TYPE_AFTER)})"
        rf"(?![\w]),?\s(?:{_NUMBER_WORD})?{_NUM}(?![\w]){_UNIT}?{_POST_TAIL}"
    )
    return number_first, prefix_numbered, prefix_first, type_after


_NUMBER_WORD = (  # the word before a house number: No. 5, д. 7, nr 3, Kav. 52, số 12
    r"(?i:n\.?\s?|nº\s?|no\.?\s?|nr\.?\s?|д\.\s?|дом\s|буд\.\s?|d\.\s?|br\.?\s?|č\.\s?|"
    r"kav\.\s?|số\s)"
)
_TYPE_AFTER = [
    *"ulitsa prospekt pereulok naberezhnaya shosse bulvar ploshchad sokak sokağı caddesi cadde "  # noqa: SIM905
    "bulvarı utca út tér katu gatan gata vägen veien vei vej gade marg nagar salai soi "
    "náměstí namesti třída trida nábřeží ulice".split(),
    *"улица ул. проспект пр. просп. переулок пер. набережная наб. шоссе бульвар площадь "  # noqa: SIM905
    "вулиця вул.".split(),
]
_HAN = "\u3005\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3041-\u3096\u30a1-\u30fa\u30fc"
_HANGUL = "\uac00-\ud7a3"
_DIGITS = "0-9０-９"
_REGION_TAIL = rf"(?:,\s(?:{_CITY}|\d{{3}}-\d{{4}}|\d{{5,6}})){{0,3}}(?:,?\s\d{{3}}-\d{{4}}(?!\d))?"
_JAPAN_ROMAJI, _JAPAN_KANJI, _CHINA, _KOREA_HANGUL, _KOREA_ROMANIZED = (
    # Japan, romanized: 1-25-7 Sakae, Naka-ku, Nagoya 460-0008 (chome-ban-go, then places)
    re.compile(
        rf"(?<![\w.,/-])(?:\d{{1,2}}-\d{{1,3}}-\d{{1,3}}(?=,?\s[{_UPPER}][\w-]+,)|\d{{1,2}}-\d{{1,3}}"
        rf"(?=,?\s[{_UPPER}][a-zōū-]+(?:,\s[{_UPPER}][a-zōū]+-(?:ku|shi|cho|chō|machi|gun|mura|ken)|"
        rf",?\s\d{{3}}-\d{{4}}(?!\d))))"
        rf",?\s[{_UPPER}][a-zōū]+(?:-(?:[{_UPPER}][a-zōū]+|ku|shi|cho|chō|machi|gun|mura))?"
        rf"{_REGION_TAIL}"
    ),
    # Japan, in kanji: 〒530-0001 大阪府大阪市北区梅田3-10-20, 東京都港区六本木6丁目10番1号
    re.compile(
        rf"(?:〒\s?\d{{3}}-?\d{{4}}\s?)?[{_HAN}{_KANA}]{{1,20}}?[都道府県市区町村郡]"
        rf"[{_HAN}{_KANA}]{{0,20}}?[{_DIGITS}]{{1,4}}(?:丁目|番地|番|号|-|－)"
        rf"(?:[{_DIGITS}]{{1,4}}(?:番地|番|号|-|－)?){{0,3}}"
    ),
    # China and Taiwan: 北京市朝阳区建国路88号 (a road word, a number, 号), floors and rooms
    re.compile(
        rf"[{_HAN}]{{0,20}}?(?:路|街|道|巷|弄|胡同|大道|里|段)[{_HAN}\d]{{0,6}}?\d{{1,5}}[号號]"
        rf"(?:[{_HAN}\dA-Za-z]{{1,6}}?(?:号楼|栋|棟|楼|樓|室|单元|層|层|座))*"
    ),
    # Korea, in Hangul: 서울특별시 강남구 테헤란로 152 (a road ending in 로/길, a number)
    re.compile(
        rf"(?:[{_HANGUL}]+(?:시|도)\s)?(?:[{_HANGUL}]+(?:구|군|시)\s)?"
        rf"[{_HANGUL}\d]+(?:로|길)\s?\d{{1,4}}(?:-\d{{1,4}})?(?:번?길\s?\d{{1,4}})?"
        rf"(?:,?\s?\d{{1,4}}(?:동|호|층))*"
    ),
    # Korea, romanized: 152 Teheran-ro, Gangnam-gu, Seoul; Sejong-daero 110
    re.compile(
        rf"(?<![\w-])(?:{_NUM},?\s)?[{_UPPER}][a-z]+(?:-[a-z0-9]+)*-(?:ro|gil|daero)"
        rf"(?:\s?\d{{1,3}}-?(?:beon-)?gil)?(?:,?\s{_NUM})?(?![\w-]){_REGION_TAIL}"
    ),
)


# Compound streets are found from their ending ("...straße 12"), then extended back to the
# start of the word (a scan, not a backtracking pattern) and forward over unit and postcode.
_COMPOUND_AT = re.compile(
    rf"{trie_regex([*ENDING_WORDS, *(e.capitalize() for e in ENDING_WORDS)])}(?=\s\d)"
)
_COMPOUND_TAIL = re.compile(rf"\s{_NUM}(?![\w]){_UNIT}?{_POST_TAIL}")


def _compound_streets(text: str) -> Iterator[tuple[int, int]]:
    last_end = 0
    for m in _COMPOUND_AT.finditer(text):
        start = m.start()
        while start > last_end and (text[start - 1].isalpha() or text[start - 1] in "-'\u2019"):
            start -= 1
        if start == m.start():
            continue  # the ending alone ("weg 3", "Gate 5"): not a street name
        word = text[start : m.end()]
        if not word[0].isupper() or word in _NOT_A_STREET or word.strip("-") != word:
            continue
        if fold(word).lower() in lexicon().dictionary:
            continue  # an English word that ends like a street (Necktie 5, Tollgate 2)
        tail = _COMPOUND_TAIL.match(text, m.end())
        if tail is None:
            continue
        last_end = tail.end()
        yield start, tail.end()


_COMPOUND_NUMBER_FIRST = re.compile(
    rf"(?<![\w.,/-])\d{{1,5}}[a-zA-Z]?,?\s([{_UPPER}][\w'\u2019-]*?"
    rf"(?:{_COMPOUND_ENDINGS}))(?![\w]){_UNIT}?{_POST_TAIL}"
)


def _compound_number_first(text: str) -> Iterator[tuple[int, int]]:
    """172 Hauptstrasse, Berlin: the house number before a compound street."""
    for m in _COMPOUND_NUMBER_FIRST.finditer(text):
        word = m.group(1)
        if word in _NOT_A_STREET or word.lower() in ENDING_WORDS:
            continue
        yield m.start(), m.end()


def warm_up() -> None:
    """Loads the gazetteer and its lexicon and compiles the street and name-shape patterns
    (once per process)."""
    gazetteer()
    lexicon()
    _street_words()
    name_shapes_warm_up()
    _east_asian_family()
    _script_warm_up()
    _address_patterns()
    _address_gates()
    _trigram_ratios()
    gazetteer_file.forget()  # every list is built: the parsed file is not needed


# A house number and a street named after a person or place, then a ward or district:
# 45 Lê Lợi, Quận 1; 12 Nguyen Trai, Ward 5, District 3 (Viet Nam, the Philippines, Indonesia)
_STREET_THEN_WARD = re.compile(
    rf"(?<![\w.,/-])(?:(?i:số)\s)?\d{{1,4}}[A-Za-z]?(?:/\d{{1,4}})?\s[{_UPPER}][\w'\u2019-]*"
    rf"(?:\s[{_UPPER}][\w'\u2019-]*){{0,3}},\s{ADMIN_UNIT}\s?[\w\d]+"
    rf"(?:,\s{ADMIN_UNIT}\s?[\w\d]+)*{_REGION_TAIL}"
)
# A unit or building first, then its street: Unit 5B, 32nd Street; Villa 12, Street 45, Al Barsha
_UNIT_FIRST_WORDS = (
    r"unit|flat|apt\.?|apartment|suite|villa|building|bldg\.?|blk\.?|block|house|h\.\s?no\.?|"
    r"plot|lot"
)
_UNIT_FIRST = re.compile(
    rf"(?<![\w-])(?i:{_UNIT_FIRST_WORDS})\s#?\d{{1,5}}[A-Za-z]?,\s"
    rf"(?:\d{{1,5}}(?:st|nd|rd|th)?\s)?[{_UPPER}][\w'\u2019-]*(?:\s(?:[{_UPPER}][\w'\u2019-]*|\d{{1,6}}(?!\d)))"
    rf"{{0,4}}(?:,\s[{_UPPER}][\w'\u2019-]*(?:\s(?:[{_UPPER}][\w'\u2019-]*|\d{{1,6}}(?!\d))){{0,3}}){{0,3}}"
)
# the first word of each unit word (apt, h): one of them is among the words of a text that
# _UNIT_FIRST can match
_UNIT_FIRST_GATE = first_words(_UNIT_FIRST_WORDS.split("|"))


def unit_first_matches(text: str) -> Iterator[re.Match[str]]:
    """``_UNIT_FIRST.finditer(text)``, tried only where a unit word the text holds starts as
    a word (a match starts with one, after no word character or dash)."""
    return finditer_from(_UNIT_FIRST, text, word_starts(text, _UNIT_FIRST_GATE & word_set(text)))


def _unit_first(text: str) -> Iterator[tuple[int, int]]:
    """Unit-first addresses whose words include a street, a ward or district word."""
    _, _, suffixes, prefixes = gazetteer()
    for m in unit_first_matches(text):
        street = m.group().split(",", 1)[1]  # after the unit: the street and its places
        words = {w.strip(",.").lower() for w in street.split()}
        if words & (suffixes | prefixes | _UNIT_AREA_WORDS):
            yield m.start(), m.end()


_UNIT_AREA_WORDS = frozenset(
    "street road avenue lane district ward city barangay sector block nagar colony layout "  # noqa: SIM905
    "village town".split()
)


@cache
def _address_gates() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The first words of the street words after a name, before a name, and after a name
    with the number after (number_first, prefix_*, type_after): a text whose words hold
    none of a set cannot match its patterns."""
    _, _, suffixes, prefixes = gazetteer()
    return first_words(suffixes), first_words(prefixes), first_words(_TYPE_AFTER)


# A street named without a street word, its number, then a postcode and city or a known
# city: Ilica 242, 10000 Zagreb; Knez Mihailova 12, 11000 Beograd; Václavské náměstí 12,
# 110 00 Praha 1; Ermou 25, 105 63 Athens; Na Příkopě 22, Praha (the postcode forms of
# central, northern and south-eastern Europe: 5 digits, 3 + 2, 4, 2-3, 4-3).
_NAMED_NUMBERED_TAIL = re.compile(
    r"(?<=\s)(?P<number>\d{1,5}[a-zA-Z]?(?:/\d{1,5}[a-zA-Z]?)?(?:\s[A-Z](?:\s\d{1,3})?)?), "
    r"(?:(?P<postcode>\d{5}|\d{3}\s\d{2}|\d{4}|\d{2}-\d{3}|\d{4}-\d{3})\s)?"
    rf"(?P<city>[{_UPPER}][\w'\u2019-]*(?:\s(?:[{_UPPER}][\w'\u2019-]*|\d{{1,2}}(?!\d)|[A-Z]\b))?)"
)
# the street before the number: a capitalised word and at most three more (the longest)
_STREET_BEFORE = re.compile(rf"(?<![\w.])[{_UPPER}][\w'\u2019.-]*(?:\s[\w'\u2019.-]+){{0,3}}?\s\Z")


def _named_numbered(text: str) -> Iterator[tuple[int, int]]:
    """The form above, found from its number and city back to its street (a pattern
    starting at the street was tried at every capital: 0.25 ms on a 4 KB prompt). Its
    street words are no English words (Chapter 12, Paris and Room 4, Berlin are no
    streets), and the city is a known place when no postcode comes first."""
    lex = lexicon()
    last_end = 0
    for m in _NAMED_NUMBERED_TAIL.finditer(text):
        if m.group("postcode") is None and not _known(m.group("city").split()[0], lex.places):
            continue
        number_at = m.start("number")
        before = _STREET_BEFORE.search(text, max(last_end, number_at - 200), number_at)
        if before is None:
            continue
        street = before.group().split()
        # the street starts after any English word in it (Deliver to Ilica 242, ...)
        for k in range(len(street) - 1, -1, -1):
            low = fold(street[k]).lower().strip(".")
            if low in lex.dictionary or low in lex.frequent or low in _NOT_BEFORE_A_NAME:
                street = street[k + 1 :]
                break
        if not street or not street[0][:1].isupper():
            continue
        start = number_at - len(" ".join(street)) - 1
        if text[start : number_at - 1] != " ".join(street):
            continue  # the street's words were not single-spaced: let it be
        last_end = m.end("city")
        yield start, last_end


# The end of an address written as comma-separated parts (South Asia, the Gulf, much of
# Africa): a city and a five- or six-digit postcode (Bengaluru 560001, Islamabad 44000).
_PIN = re.compile(r"(?<=\s)(?:\d{5,6}|\d{3}\s\d{3})(?!\d)")
_CITY_BEFORE_PIN = re.compile(
    rf"[{_UPPER}][\w'\u2019.-]*(?:\s[{_UPPER}][\w'\u2019.-]*){{0,2}},?\s\Z"
)
_PART_WORDS = frozenset(
    "no no. h.no. h.no flat plot house shop unit door building bldg. floor block phase "  # noqa: SIM905
    "sector road street lane cross main stage layout nagar colony extension marg".split()
)
_PART_WORD = re.compile(
    r"(?:#?\d{1,5}(?:st|nd|rd|th)?[A-Za-z]?(?:[/-](?:\d{1,5}[A-Za-z]?|[A-Za-z]))*"  # 8-2-293, 12/A
    r"|[A-Z]{2,3}"  # MG Road, HSR Layout
    r"|[A-Z]{1,2}-\d{1,5}(?:/\d{1,3})?"  # B-42, F-8/3
    r"|[IVX]{1,4})"  # Lajpat Nagar II
)


def _address_part_word(word: str, lex: Lexicon, street_words: frozenset[str]) -> bool:
    """A word that can be part of a comma-separated address: a number, a unit or street word,
    or a capitalised word that is no English word (a locality: Indiranagar, Banjara)."""
    low = word.lower()
    if low in _PART_WORDS or low in street_words or _PART_WORD.fullmatch(word):
        return True
    return (
        word[:1].isupper()
        and word[1:].replace("-", "").replace("'", "").isalpha()
        and fold(low) not in lex.dictionary
        and fold(low) not in lex.frequent
    )


@cache
def _street_words() -> frozenset[str]:
    _, _, suffixes, prefixes = gazetteer()
    return suffixes | prefixes


def _comma_chain(text: str) -> Iterator[tuple[int, int]]:
    """An address of comma-separated parts ending in a city and a six-digit postcode
    (B-42, Lajpat Nagar II, New Delhi 110024; H.No. 8-2-293, Road No. 10, Banjara Hills,
    Hyderabad 500034): the parts before the city are taken back while every word of a part
    can be an address's (a number, a unit or street word, a locality), at most five parts;
    the first part may begin after a lower-case word or a label (Deliver to B-42, ...;
    Address: #12, ...). At least one part holds a number besides the postcode."""
    lex = lexicon()
    street_words = _street_words()
    for pin in _PIN.finditer(text):
        city = _CITY_BEFORE_PIN.search(text, max(0, pin.start() - 120), pin.start())
        if city is None:
            continue
        start = city.start()
        numbered = False
        for _ in range(5):
            if not text.startswith(", ", start - 2):
                break
            seg_start = text.rfind(",", 0, start - 2) + 1
            words = text[seg_start : start - 2].split()
            k = len(words)
            while k > 0 and _address_part_word(words[k - 1], lex, street_words):
                k -= 1
            if k == len(words):
                break  # no part here
            part = " ".join(words[k:])
            at = text.rfind(part, seg_start, start - 1)
            if at < 0:
                break  # its words were not single-spaced
            if k > 0 and not (words[k - 1].islower() or words[k - 1].endswith(":")):
                break  # after a capitalised word (Chapter 3, ...): no address part
            numbered = numbered or any(c.isdigit() for c in part)
            start = at
            if k > 0:
                break  # after other words (Deliver to B-42, ...): the address starts here
        if numbered:
            yield start, pin.end()


# Norwegian and Danish streets whose street word stands apart, lower case, after a name in
# the genitive: Karl Johans gate 22, Thorvald Meyers gate 5, Kongens gate 6 (Storgata 5 and
# Vesterbrogade 12 are compounds, found as such); without the genitive only before a
# four-digit postcode and a town (Bygdøy allé 5, 0257 Oslo). Not "gate 22" alone, nor
# "Heathrow gate 22" (an airport gate), nor a number that counts minutes or hours.
_SEPARATE_STREET_WORDS = "gate|gata|vei|veg|gade|vej|plass|torg|allé"
_SEPARATE_STREET_GATE = first_words(_SEPARATE_STREET_WORDS.split("|"))
_NORDIC_NAME = r"[A-ZÆØÅ][\w'.-]*"
_SEPARATE_WORD_AT = re.compile(rf"[ \t](?:{_SEPARATE_STREET_WORDS})[ \t]\d")
_SEPARATE_STREET = re.compile(
    rf"(?<![\w-])(?:{_NORDIC_NAME}[ \t]){{0,3}}"
    rf"(?:({_NORDIC_NAME}s)[ \t](?:{_SEPARATE_STREET_WORDS})[ \t]\d{{1,4}}[A-Za-z]?\b"
    r"(?![ \t]*(?:min|mins|minutes|minutter|h|hours|timer|am|pm)\b)"
    r"(?:,[ \t]\d{4}[ \t][A-ZÆØÅ][\w-]+)?"
    rf"|{_NORDIC_NAME}[ \t](?:{_SEPARATE_STREET_WORDS})[ \t]\d{{1,4}}[A-Za-z]?,[ \t]\d{{4}}"
    r"[ \t][A-ZÆØÅ][\w-]+)"
)


def _separate_streets(text: str) -> Iterator[tuple[int, int]]:
    """:data:`_SEPARATE_STREET`'s matches whose genitive is no place and no English word
    (Paris gate 5, Departures gate 3: a gate where one boards)."""
    lex = lexicon()
    seen: set[tuple[int, int]] = set()
    # tried only in the 80 characters before each street word and its number (up to four
    # name words), not from every capital of the text
    for word in _SEPARATE_WORD_AT.finditer(text):
        for m in _SEPARATE_STREET.finditer(text, max(0, word.start() - 80), word.end() + 40):
            if m.span() not in seen and not _boarding_gate(m.group(1), lex):
                seen.add(m.span())
                yield m.span()


def _boarding_gate(genitive: str | None, lex: Lexicon) -> bool:
    """The word before the street word is a place or an English word (Paris, Departures)."""
    return genitive is not None and (
        _known(genitive, lex.places)
        or fold(genitive).lower() in lex.dictionary
        or fold(genitive[:-1]).lower() in lex.dictionary
    )


def _other_forms(found: frozenset[str]) -> Iterator[re.Pattern[str]]:
    """The patterns of other address formats whose marks the text holds (prefilter.marks:
    a comma then a ward or district word, a dashed number, a Korean road word, a
    prefecture or ward character then a number, a number then 号, 로 or 길 then a number)."""
    if "admin" in found:
        yield _STREET_THEN_WARD
    if "dashed_number" in found:
        yield _JAPAN_ROMAJI
    if "korean_road" in found:
        yield _KOREA_ROMANIZED
    if "japan_block" in found:
        yield _JAPAN_KANJI
    if "china_number" in found:
        yield _CHINA
    if "korean_road_number" in found:
        yield _KOREA_HANGUL


def prefix_matches(
    pattern: re.Pattern[str], text: str, starts: list[int] | None = None
) -> Iterator[re.Match[str]]:
    """``pattern.finditer(text)`` for the street-type-first patterns (prefix_first,
    prefix_numbered), tried only where a street-type word the text holds starts as a word, and
    up to 16 characters before it (a house number, its letter or second part, a comma and a
    space: at most 16); ``starts``: those, found already (both patterns use the same)."""
    return finditer_from(pattern, text, prefix_starts(text) if starts is None else starts)


def prefix_starts(text: str) -> list[int]:
    """Where prefix_matches tries its patterns: a match starts a word (its house number or
    its street-type word), so of the 16 characters before a street-type word only where a
    word starts."""
    _, before_name, _ = _address_gates()
    return [
        i
        for i in word_starts(text, before_name & word_set(text), 16)
        if i == 0 or not text[i - 1].isalnum()
    ]


def find_addresses(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    found = marks(text) if found is None else found
    if "digit" not in found or not _DIGIT.search(text):
        return
    # the street patterns run only when the text has one of their street words
    present = word_set(text)
    number_first, prefix_numbered, prefix_first, type_after = _address_patterns()
    after_name, before_name, type_words = _address_gates()
    scans: list[Iterator[re.Match[str]]] = []
    if not after_name.isdisjoint(present):
        scans.append(number_first.finditer(text))
    if not before_name.isdisjoint(present):
        starts = prefix_starts(text)
        scans += (
            prefix_matches(prefix_numbered, text, starts),
            prefix_matches(prefix_first, text, starts),
        )
    if not type_words.isdisjoint(present):
        scans.append(type_after.finditer(text))
    scans.extend(p.finditer(text) for p in _other_forms(found))
    spans = [(m.start(), m.end()) for scan in scans for m in scan]
    if "compound_ending" in found:
        spans.extend(_compound_streets(text))
        spans.extend(_compound_number_first(text))
    if not _UNIT_FIRST_GATE.isdisjoint(present):
        spans.extend(_unit_first(text))
    if not _SEPARATE_STREET_GATE.isdisjoint(present):
        spans.extend(_separate_streets(text))
    if ", " in text:
        spans.extend(_named_numbered(text))
        spans.extend(_comma_chain(text))
    for start, end in spans:
        s = text[start:end]
        yield Span(start, end - (len(s) - len(s.rstrip(" ,."))), ADDRESS)
