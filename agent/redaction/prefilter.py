# ruff: noqa: RUF001, RUF002 (look-alike letters that re folds together, full-width digits)
"""Cheap checks that tell a detector its expensive pattern cannot match a text.

Most patterns need a keyword somewhere (a street word, a unit word, a form of address): when
the text holds none of them, the pattern's scan is skipped. A check here is a *necessary*
condition of a match, never a guess, so skipping changes nothing that is found.

Keywords matched case-insensitively (``(?i:...)``) are compared as words: the text's runs of
word characters, folded exactly as Python's ``re`` compares letters under ``IGNORECASE``
(simple lower case, plus the letters ``re`` holds equal beyond it: ``ı`` and ``i``, ``ſ``
and ``s``, ``İ`` and ``i``, the old Cyrillic and Greek variants), so a word the pattern
would accept is never missed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

from agent.redaction import mark_words

# Letters Python's re treats as equal under IGNORECASE beyond their simple lower case
# (re._casefix, Python 3.11+), each mapped to one member of its class; İ (U+0130) first,
# whose str.lower() is two characters where re's is one ("i").
# tests/agent/redaction/test_redaction_prefilter.py checks these against the running re.
_FOLD_BEFORE = {0x130: "i"}
_FOLD_AFTER = {
    305: 105, 383: 115, 953: 837, 956: 181, 963: 962, 976: 946, 977: 952, 981: 966,
    982: 960, 1008: 954, 1009: 961, 1013: 949, 7296: 1074, 7297: 1076, 7298: 1086,
    7299: 1089, 7300: 1090, 7301: 1090, 7302: 1098, 7303: 1123, 7835: 7777, 8126: 837,
    8147: 912, 8163: 944, 42571: 7304, 64262: 64261,
}  # fmt: skip
_WORD_RUN = re.compile(r"\w+")
_FOLD_AFTER_ANY = re.compile("[" + "".join(chr(k) for k in _FOLD_AFTER) + "]")


def case_fold(text: str) -> str:
    """The text as ``re`` compares it under IGNORECASE, one character for one."""
    if text.isascii():
        return text.lower()
    if "\u0130" in text:
        text = text.translate(_FOLD_BEFORE)
    low = text.lower()
    # str.translate costs ten times a search: only when there is something to map
    return low.translate(_FOLD_AFTER) if _FOLD_AFTER_ANY.search(low) else low


# The last text's words: the address and the password detectors both ask for the words of
# the same text (one tuple, replaced whole: safe to share between threads).
_last_words: tuple[str, frozenset[str]] = ("", frozenset())


def words(text: str) -> frozenset[str]:
    """The folded runs of word characters of ``text``."""
    global _last_words
    last, found = _last_words
    if last is text:
        return found
    found = frozenset(_WORD_RUN.findall(case_fold(text)))
    _last_words = (text, found)
    return found


def finditer_from(
    pattern: re.Pattern[str], text: str, starts: Iterable[int]
) -> Iterator[re.Match[str]]:
    """What ``pattern.finditer(text)`` yields, given ``starts``: every position, in
    ascending order, where a match can start (more is allowed, never fewer). ``re`` tries
    every position of the text for a pattern that starts with a lookbehind or a
    case-insensitive word; here it tries only these. A match at a position sees the text
    before it (lookbehinds, ``\\b``) as in a scan of the whole text, and the scan goes on
    from where a match ended, as finditer does (the patterns given never match empty)."""
    pos = 0
    match = pattern.match
    for start in starts:
        if start < pos:
            continue
        m = match(text, start)
        if m is not None:
            yield m
            pos = m.end() if m.end() > start else start + 1


def keyword_starts(text: str, roots: Iterable[str], back: int = 0) -> list[int]:
    """Where a case-insensitive match of a pattern whose keywords each start with one of
    ``roots`` (lower case) can start: every occurrence of a root in the folded text
    (:func:`case_fold`, one character for one, so its positions are the text's), and the
    ``back`` positions before it (a ``_`` or a house number before the keyword), ascending."""
    return literal_starts(case_fold(text), roots, back)


def word_starts(text: str, roots: Iterable[str], back: int = 0) -> list[int]:
    """Where each of ``roots`` is a whole word of the folded text (a run of word characters,
    as :func:`words` reads them) and the ``back`` positions before it, ascending: the
    candidate starts of a case-insensitive pattern whose keyword's first word is a root."""
    folded = case_fold(text)
    size = len(folded)
    found: set[int] = set()
    for root in roots:
        at = folded.find(root)
        while at >= 0:
            end = at + len(root)
            if (at == 0 or not _is_word_char(folded[at - 1])) and (
                end == size or not _is_word_char(folded[end])
            ):
                found.update(range(max(0, at - back), at + 1))
            at = folded.find(root, at + 1)
    return sorted(found)


def _is_word_char(ch: str) -> bool:
    """``re``'s ``\\w`` (str patterns): a letter, a digit or a number, or ``_``."""
    return ch.isalnum() or ch == "_"


def literal_starts(text: str, literals: Iterable[str], back: int = 0) -> list[int]:
    """Every position of each of ``literals`` in ``text`` and the ``back`` positions before
    it, ascending (the candidate starts of :func:`finditer_from`)."""
    found: set[int] = set()
    for literal in literals:
        at = text.find(literal)
        while at >= 0:
            found.update(range(max(0, at - back), at + 1))
            at = text.find(literal, at + 1)
    return sorted(found)


class _Re2Starts:
    """Where the leftmost-first, non-overlapping matches of an RE2 pattern start, in
    characters (one RE2 pass over the text's UTF-8), or ``None`` where RE2 is not installed
    or the text cannot be encoded."""

    def __init__(self, pattern: str) -> None:
        self._pattern: Any = None
        try:
            import re2
        except ImportError:
            return
        self._pattern = re2.compile(pattern)

    def __call__(self, text: str) -> list[int] | None:
        if self._pattern is None:
            return None
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            return None
        starts = [m.start() for m in self._pattern.finditer(data)]
        if starts and len(data) != len(text):  # byte offsets to characters
            starts = [len(data[:at].decode("utf-8")) for at in starts]
        return starts


# RE2 patterns whose match starts include every start of a detector's pattern (see each
# use); compiled on first use.
_RE2_STARTS = {
    # detectors._TOKEN: a match starts a maximal run of 24 or more of its characters (what
    # is before it is none of them); the leftmost match of this greedy pattern starts a run
    # and ends it, so the next one starts the next run
    "token": r"[A-Za-z0-9_\-+/]{24,}",
    # detectors._IBAN: two letters then two digits, after no word character; no such four
    # start inside another (a start inside one would follow a letter or digit)
    "iban": r"[A-Za-z]{2}\p{Nd}{2}",
    # detectors._IPV4: four dotted groups of digits, after no digit or dot; a start inside
    # another match would follow a digit or a dot
    "ipv4": r"\p{Nd}{1,3}\.\p{Nd}{1,3}\.\p{Nd}{1,3}\.\p{Nd}",
    # detectors._SSN: three, two and four digits with a dash or space between, after no digit
    # and such; a start inside another match would follow a digit
    "ssn": r"\p{Nd}{3}[- ]\p{Nd}{2}[- ]\p{Nd}{4}",
}
_re2_starts: dict[str, _Re2Starts] = {}
# Shorter texts are scanned by re itself: encoding one for RE2 and calling it cost more than
# re's scan of a short text (about 3 us against 1-2 us for the held-out documents' 90 bytes).
SHORT_TEXT = 256


def re2_starts(name: str, text: str) -> list[int] | None:
    """The starts of :data:`_RE2_STARTS` ``[name]``'s (or the mark ``name``'s) matches in
    ``text``, ascending: the candidate starts of :func:`finditer_from` (``None`` where RE2
    is missing or the text is shorter than :data:`SHORT_TEXT`: then the caller scans it
    whole)."""
    if len(text) < SHORT_TEXT:
        return None
    starts = _re2_starts.get(name)
    if starts is None:  # (or a mark's pattern: "shape", "phone_word")
        starts = _re2_starts[name] = _Re2Starts(_RE2_STARTS.get(name) or mark_patterns()[name])
    return starts(text)


def first_words(keywords: Iterable[str]) -> frozenset[str]:
    """The folded first run of word characters of each keyword: a case-insensitive match of
    a keyword that starts and ends at a word boundary has it among the text's
    :func:`words`. Every keyword must start with a word character."""
    out = set()
    for k in keywords:
        m = _WORD_RUN.match(case_fold(k))
        if m is None:
            raise ValueError(f"keyword {k!r} does not start with a word character")
        out.add(m.group())
    return frozenset(out)


# ------------------------------------------------------------------------- marks

# What a text must hold for a detector's patterns to match it, written for RE2: each is implied
# by the patterns it stands for (re's \d is any Unicode decimal digit: \p{Nd}; re's \s is
# matched by _SPACE, RE2's \s is ASCII), so a text without the mark cannot match them. One
# RE2 set tells which of them a text holds, in one pass over it.
_D = r"\p{Nd}"
# hyphens and parentheses typed in CJK text (U+2010, U+2011, fullwidth, the long-vowel mark)
_CJK_DASHES = r"\x{2010}\x{2011}\x{ff0d}\x{30fc}\x{ff08}\x{ff09}"
_SPACE = r"[\t-\r\x{1c}-\x{20}\x{85}\p{Z}]"
_HAN_KANA = (
    r"\x{3005}\x{3400}-\x{4dbf}\x{4e00}-\x{9fff}\x{f900}-\x{faff}"
    r"\x{3041}-\x{3096}\x{30a1}-\x{30fa}\x{30fc}"
)


def _literals(words: Iterable[str]) -> str:
    return "(?:" + "|".join(re.escape(w) for w in words) + ")"


# Letters outside ASCII that re's IGNORECASE takes for an ASCII one and RE2's (?i) does not:
# dotted and dotless I, the long s, the Kelvin sign (the first three above, or str.lower()).
_RE_ONLY_EQUALS = "\u0130\u0131\u017f\u212a"


def _caseless_literals(words: Iterable[str]) -> str:
    """An RE2 pattern for ``words`` in any case, as ``re`` under IGNORECASE finds them: each
    letter a class of what ``re`` holds equal to it ("pin": also "PİN", "pın")."""

    def letter(c: str) -> str:
        same = {c, c.upper(), *(x for x in _RE_ONLY_EQUALS if case_fold(x) == c)}
        return "[" + "".join(sorted(same)) + "]" if len(same) > 1 else re.escape(c)

    return "(?:" + "|".join("".join(letter(c) for c in w) for w in words) + ")"


@cache
def mark_patterns() -> dict[str, str]:
    """Each mark's RE2 pattern, by name (built from the detectors' own word lists)."""
    endings = mark_words.ENDING_WORDS
    phone_words = (
        *mark_words.PHONE_WORDS,
        *mark_words.NUMBER_WORDS,
        *mark_words.PHONE_WORDS_JOINED,
    )
    return {
        # any digit (every address form has a number)
        "digit": _D,
        # find_cards: 12 to 19 digits, single spaces or dashes between
        "card": rf"{_D}(?:[ -]?{_D}){{11}}",
        "ssn": rf"{_D}{{3}}[- ]{_D}{{2}}[- ]{_D}{{4}}",
        # find_ssns: the words before a bare SSN (detectors._SSN_WORDS)
        "ssn_word": _caseless_literals(("ssn", "social", "sozial")),
        "ipv4": rf"{_D}\.{_D}{{1,3}}\.{_D}{{1,3}}\.{_D}",
        "iban": rf"[A-Za-z]{{2}}{_D}{{2}}(?: ?[A-Za-z0-9]){{11}}",
        # find_phones: 7 to 15 digits, at most three of space . - / ( ) (or their fullwidth and
        # CJK forms) between two of them
        "phone": rf"{_D}(?:[ .\-/(){_CJK_DASHES}]{{0,3}}{_D}){{6}}",
        # find_secrets: the known key shapes' prefixes, the words of assigned secrets
        # (looked for in the case-folded text there), long tokens
        "shape": mark_words.SHAPE_HEADS,
        # find_phones: its phone words and words for a number (detectors._PHONE_CONTEXT in
        # case-folded text): the ASCII ones at RE2's (ASCII) word boundaries, which hold
        # wherever re's do, the others anywhere; also where _PHONE_WORD's are looked for
        "phone_word": (
            r"\b"
            + _caseless_literals(w for w in phone_words if w.isascii())
            + r"\b|"
            + _caseless_literals(w for w in phone_words if not w.isascii())
        ),
        "assigned": _caseless_literals(mark_words.ASSIGNED_MARKERS),
        "token": r"[A-Za-z0-9_\-+/]{24}",
        # the address forms of names.py
        "admin": rf",{_SPACE}{mark_words.ADMIN_UNIT}",
        "dashed_number": rf"{_D}-{_D}",
        "korean_road": r"-(?:ro|gil|daero)",
        "han": r"[\x{3005}\x{3400}-\x{4dbf}\x{4e00}-\x{9fff}\x{f900}-\x{faff}]",
        "hangul": r"[\x{ac00}-\x{d7a3}]",
        # _KOREA_HANGUL: a road word then its number; _CHINA: a number then 号;
        # _JAPAN_KANJI: a prefecture, city or ward character, then a number
        "korean_road_number": rf"[로길]{_SPACE}?{_D}",
        "china_number": rf"{_D}[号號]",
        "japan_block": rf"[都道府県市区町村郡][{_HAN_KANA}]{{0,20}}[0-9０-９]",
        # _compound_streets: an ending (either case) then a space and a number (Kungsgatan 12);
        # _compound_number_first: a number, a capitalised word ending in one (172 Hauptstrasse)
        # (the endings alone are in ordinary words: investigate, parties)
        "compound_ending": rf"{_literals([*endings, *(e.capitalize() for e in endings)])}"
        rf"{_SPACE}{_D}|{_D}[a-zA-Z]?,?{_SPACE}\p{{Lu}}[\p{{L}}\p{{M}}\p{{N}}_'\x{{2019}}-]*"
        rf"{_literals(endings)}",
        # script_names.py: letters of the caseless scripts and of CJK
        "non_latin": r"[\x{590}-\x{dff}\x{e00}-\x{e7f}\x{10a0}-\x{10ff}\x{530}-\x{58f}"
        r"\x{3040}-\x{d7a3}\x{f900}-\x{faff}]",
        # script_names._caseless: a word of the scripts without capitals
        "caseless": r"[\x{600}-\x{6ff}\x{750}-\x{77f}\x{590}-\x{5ff}\x{900}-\x{dff}"
        r"\x{e00}-\x{e7f}\x{10a0}-\x{10ff}\x{530}-\x{58f}\x{1200}-\x{137f}]",
    }


MARK_NAMES = (
    *("digit", "card", "ssn", "ssn_word", "ipv4", "iban", "phone", "phone_word", "shape"),
    "assigned",
    "token",
    *("admin", "dashed_number", "korean_road", "han", "hangul", "korean_road_number"),
    *("china_number", "japan_block", "compound_ending", "non_latin", "caseless"),
)
ALL_MARKS = frozenset(MARK_NAMES)


class _MarkSet:
    """The marks as one RE2 set (``google-re2``), or, where it is not installed, none: then
    every text is said to hold every mark and every pattern runs, as before."""

    def __init__(self) -> None:
        self.names = MARK_NAMES
        self._set: Any = None
        try:
            import re2
        except ImportError:
            return
        options = re2.Options()
        options.max_mem = 64 << 20
        marks = re2.Set.SearchSet(options)
        patterns = mark_patterns()
        for name in self.names:
            marks.Add(patterns[name])
        marks.Compile()
        self._set = marks

    @property
    def compiled(self) -> bool:
        return self._set is not None

    def __call__(self, text: str) -> frozenset[str]:
        if self._set is None:
            return ALL_MARKS
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no claim about this text
            return ALL_MARKS
        found = self._set.Match(data)
        names = self.names
        return frozenset(names[i] for i in found) if found else _NONE


_NONE: frozenset[str] = frozenset()
_marks: _MarkSet | None = None


def marks(text: str) -> frozenset[str]:
    """The marks ``text`` holds (:func:`mark_patterns`); every one where RE2 is missing."""
    global _marks
    if _marks is None:
        _marks = _MarkSet()
    return _marks(text)


def warm_up() -> None:
    marks("")
