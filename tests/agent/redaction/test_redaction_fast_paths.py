# ruff: noqa: RUF001, RUF002, SIM905 (look-alike letters that re folds together are meant)
"""The fast paths of the redaction detectors find exactly what their reference patterns find.

Patterns that start with a lookbehind or a case-insensitive word make ``re`` try every
position of a text; the detectors try them only where a match can start
(``prefilter.finditer_from``), or use a rewritten pattern whose first character lets ``re``
skip ahead. Each is checked here against the plain scan of its reference pattern on every
labelled set (and changed copies of it) and on seeded random texts built from the patterns'
own words, the letters ``re`` folds together under IGNORECASE (ſ, K, İ, ı) and separators.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator
from functools import cache

import pytest

from agent.redaction import detectors, names, prefilter, script_names
from benchmarks.redaction_data import DATA_DIR, load_documents

_PIECES = [
    # keywords of the assigned secrets and the loose passwords, in several cases
    *"api_key apikey API-KEY access_key access-token secret secret_key SECRET-KEY".split(),
    "client_secret",
    *"auth_token refresh-token token Token password passwd pwd passphrase private_key".split(),
    *"account_key shared_access_key AccountKey Bearer BEARER bearer pass pw pin passcode".split(),
    *"kennwort Kennwort PIN PW".split(),
    "mot de passe",
    # "password" in other languages, in their cases, and the fullwidth colon after them
    *"Passwort MDP contraseña CONTRASEÑA senha Wachtwoord hasło HASŁO heslo lösenord".split(),
    *"adgangskode passord Salasana jelszó Şifre şifre sifre parolă пароль ПАРОЛЬ".split(),
    *"密码 密碼 口令 パスワード 暗証番号 비밀번호 पासवर्ड".split(),
    "kata sandi",
    "mật khẩu",
    "Mat khau",
    "كلمة المرور",
    "\uff1a",
    "pass hunter2xyz",
    "PIN 12345678",
    "kennwort  Abc12345!",
    "Passcode\tZx9-Zx9-Zx9",
    "ſecret",  # a long s: re's IGNORECASE holds it equal to s
    "toKen",  # the Kelvin sign
    "İd",
    "apı_key",  # a dotless i
    "AWS_SECRET_ACCESS_KEY",
    # key shapes whose marker is not where they start (detectors._SHAPE_MARKER_BACK)
    "do" + "p_v1_" + "ab12" * 16,
    "https://hooks.slack.com/services/T0ABC/B0DEF/xyz123",
    "https://api.softlayer.com/soap/v3/" + "a1" * 32,
    "abcdefgh123456.atlasv1." + "q" * 64,
    "abc8Q~" + "Zz9" * 11 + "x",
    # what follows them
    "=",
    ":",
    " = ",
    ": ",
    '"',
    "'",
    " is ",
    " was ",
    "\n",
    ", ",
    "; ",
    "_",
    "-",
    " ",
    "hunter2xyz",
    "Xk9$abcd1234",
    "s3cr3t-VALUE",
    "<redacted>",
    "none",
    "Abcdef12345!",
    # long tokens, after what may and may not come before one
    "AbCdEfGhIjKlMnOpQrStUvWx12",
    "abc123+/abc123+/abc123+/ab==",
    "x" * 23,
    "Zz9-" * 7,
    "é",
    ".",
    "ünïcode",
    "🙂",
    # IBANs and IPv4 addresses, and digits in other scripts (re's \\d is any decimal digit)
    "DE89 3704 0044 0532 0130 00",
    "GB82WEST12345698765432",
    "ABCD12",
    "xDE89370400440532013000",
    "NL91ABNA0417164300",
    "DE٨٩ 3704 0044 0532 0130 00",
    "10.0.0.1",
    "192.168.1.254/24",
    "1.2.3.4.5",
    "٣.٤.٥.٦",
    "1.2.3",
    "v10.0.0.1",
    "0x1.2.3.4",
    # IPv6-ish
    "fe80::1",
    "2001:db8::ff00:42:8329",
    "::",
    "::1",
    "a:b:c",
    "1:2:3:4:5:6:7:8",
    "abcd:",
    ":ef",
    "12:34",
    "v1.2:3",
    "[::ffff:10.0.0.1]",
    "/64",
    "ff:",
    "1.2.3.4",
    # labels before Han names
    "Name:",
    "name",
    "DEAR",
    "Dear ",
    "mr.",
    "Mr ",
    "Ms.",
    "Dr ",
    "attn：",
    "Attn:",
    "holder",
    "customer",
    "recipient ",
    "patient:",
    "contact",
    "王伟",
    "李秀英",
    "张",
    "佐藤健一",
    "　",
    "Dear 王伟",
    # Hangul and Han names alone or before a title, and the words that are none
    "김민준님",
    "박서연 고객님",
    "이지은씨",
    "고객님",
    "간호사",
    "김 선생님",
    "저는 김민준",
    "최유리 과장님",
    "Customer 김민준 called",
    "Hi 王秀英, your order",
    "이름: 정하늘",
    "김간호",
    "간호사님",
    "간호 선생님",
    "박사장님",
    "김민준 씨",
    "이서준",
    "님",
    "윤아름 대리님께",
    "Name: 李秀英",
    "MR.张",
    "attn 佐藤健一",
    "：",
    "items",
    "drive",
    "names",
    # address prefixes, house numbers
    "12",
    "12a",
    "5/7",
    "3 bis",
    "23,",
    "Calle",
    "calle",
    "Via",
    "VIA",
    "via",
    "rue",
    "Rue de",
    "C. Mayor",
    "ul.",
    "Ul.",
    "av.",
    "Avenida",
    "Jalan",
    "Jl.",
    "soi",
    "Rua",
    "Alcalá",
    "Roma",
    "Victor Hugo",
    "Mayor",
    "Hauptstraße",
    "10115 Berlin",
    "Madrid",
    "12345 b-12345c, Calle Mayor 7",  # the longest house number before the street type
    "12345 bis, rue Victor Hugo",
    # phone numbers and what is not one
    "+49 30 1234567",
    "(030) 1234 5678",
    "555-123-4567",
    " x1234",
    " ext. 12",
    "extension 9",
    "06 12 34 56 78",
    "3420837783",
    "0987654321",
    "1234567",
    "12345678",
    "phone: ",
    "Tel ",
    "call ",
    "v",
    "version ",
    "2024-01-02",
    "123-45-6789",
    "12.34.56.78",
    "212.555.0100",
    "(212) 555-0100)",
    "version 10.0.0.1",
    "Firmware\n",
    "REV ",
    "build ",
    "pip==",
    "0044 20 7946 0958",
    "电话",
    "Unit 5B, 32nd Street",
    "Villa 12, Street 45, Al Barsha",
    "H. No. 12, Gandhi Nagar",
    "h.no 7, MG Road",
    "FLAT #3, Park Lane",
    "Apt. 4, Main Road",
    "bldg 9, Sector 5",
    "-lot 3, ",
    "1-2-3",
    "1-25-7",
    "Sakae,",
    "Naka-ku,",
    "Nagoya",
    "460-0008",
    "12-3",
    "Shibuya",
]


@cache
def _texts() -> tuple[str, ...]:
    texts: list[str] = []
    for path in sorted(DATA_DIR.glob("*.txt")):
        docs = load_documents(path)
        for doc in docs:
            texts += [doc.text, doc.text.lower(), doc.text.upper()]
        # long texts (the 4 KB prompt's kind): every tenth document on, joined
        texts += ["\n\n".join(d.text for d in docs[k::10]) for k in range(10)]
    rng = random.Random(27)
    for _ in range(4000):
        texts.append("".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 14))))
    return tuple(texts)


def _spans(matches: Iterable[re.Match[str]]) -> list[tuple[tuple[int, int], ...]]:
    return [tuple(m.span(g) for g in range(m.re.groups + 1)) for m in matches]


def _prefix_first(text: str) -> Iterator[re.Match[str]]:
    return names.prefix_matches(names._address_patterns()[2], text)


def _prefix_numbered(text: str) -> Iterator[re.Match[str]]:
    return names.prefix_matches(names._address_patterns()[1], text)


FAST_PATHS: dict[
    str, tuple[Callable[[str], Iterable[re.Match[str]]], Callable[[], re.Pattern[str]]]
] = {
    "assigned secrets": (detectors.assigned_matches, lambda: detectors._SECRET_ASSIGNED),
    "loose passwords": (detectors.loose_password_matches, lambda: detectors._LOOSE_PASSWORD),
    "IPv6": (detectors.ipv6_matches, lambda: detectors._IPV6),
    "long tokens": (detectors.token_matches, lambda: detectors._TOKEN),
    "key shapes": (detectors.shape_matches, lambda: detectors._SECRET_SHAPES),
    "IBAN": (detectors.iban_matches, lambda: detectors._IBAN),
    "IPv4": (detectors.ipv4_matches, lambda: detectors._IPV4),
    "SSN": (detectors.ssn_matches, lambda: detectors._SSN),
    "Latin label before a Han name": (
        script_names.latin_label_matches,
        lambda: script_names._LATIN_LABEL_AT,
    ),
    "unit first": (names.unit_first_matches, lambda: names._UNIT_FIRST),
    "street type first": (_prefix_first, lambda: names._address_patterns()[2]),
    "number, then street type first": (_prefix_numbered, lambda: names._address_patterns()[1]),
}


@pytest.mark.parametrize("short_text", [prefilter.SHORT_TEXT, 0])
@pytest.mark.parametrize("name", list(FAST_PATHS))
def test_a_fast_path_finds_what_its_pattern_finds(
    name: str, short_text: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with 0, the RE2 starts are used for every text, the short ones too
    monkeypatch.setattr(prefilter, "SHORT_TEXT", short_text)
    fast, reference = FAST_PATHS[name]
    pattern = reference()
    found = 0
    for text in _texts():
        expected = _spans(pattern.finditer(text))
        assert _spans(fast(text)) == expected, text
        found += len(expected)
    assert found > 20  # the texts hold matches of every pattern checked


def _reference_phones(text: str) -> Iterator[tuple[int, int]]:
    """find_phones's shaped numbers as they were before its phone-word search was made once
    per number (the loose groupings after a phone word are tested in test_redaction_world)."""
    if "phone" not in prefilter.marks(text):
        return
    d = detectors
    # the phone words as IGNORECASE reads them (find_phones searches the case-folded text)
    context_i = re.compile(d._PHONE_CONTEXT.pattern, re.IGNORECASE)
    word_i = re.compile(d._PHONE_WORD.pattern, re.IGNORECASE)
    for m in d._PHONE.finditer(text):
        raw = m.group()
        start, end = m.start(), m.end()
        if raw.endswith(")") and raw.count("(") < raw.count(")"):
            raw = raw[:-1]
            end -= 1
        digits = sum(c.isdigit() for c in d._EXTENSION.sub("", raw))
        international = raw[0] == "+" or raw.startswith("00")
        if not 7 <= digits <= 15:
            continue
        if (
            d._DATE_LIKE.fullmatch(raw)
            or d._SSN_SHAPE.fullmatch(raw)
            or d._version_context(text, start)
        ):
            continue
        if not international:
            if d._after_tax_label(text, start):
                continue
            if digits < 9 and not context_i.search(text[max(0, start - 40) : start]):
                continue
            if "." in raw and raw.count(".") != 2:
                continue
            core = d._EXTENSION.sub("", raw)
            na = re.fullmatch(r"\(?[2-9]\d{2}\)?[ .\-]?\d{3}[ .\-]\d{4}", core)
            if core.isdigit() and not (
                (core[0] == "0" and len(core) >= 9)
                or re.fullmatch(r"[2-9]\d{9}", core)
                or context_i.search(text[max(0, start - 40) : start])
            ):
                continue
            if not (
                raw[0] == "0"
                or raw[0] == "("
                or na
                or re.fullmatch(r"[2-9]\d{9}", raw)
                or context_i.search(text[max(0, start - 40) : start])
            ):
                continue
        elif digits < 8 and not word_i.search(text[max(0, start - 40) : start]):
            continue
        yield start, end


def test_phones_are_what_they_were() -> None:
    found = 0
    for text in _texts():
        expected = list(_reference_phones(text))
        marked = prefilter.marks(text)
        shaped = detectors._shaped_phones(text, "phone_word" in marked) if "phone" in marked else []
        assert [(s.start, s.end) for s in shaped] == expected, text
        found += len(expected)
    assert found > 100


def _reference_hangul(text: str) -> Iterator[tuple[int, int]]:
    """script_names._hangul as it was before its word lists became tuples (with the case
    particles added since)."""
    sn = script_names
    _, family, given, _ = sn._lists()
    for m in sn._HANGUL_WORD.finditer(text):
        word = m.group()
        start = m.start()
        if word[0] not in family or any(word.startswith(w) for w in sn._HANGUL_NOT_NAMES):
            continue
        before = text[max(0, start - 12) : start]
        name_len = None
        for suffix in sorted(sn._HANGUL_AFTER.split("|"), key=len, reverse=True):
            if word.endswith(suffix) and 2 <= len(word) - len(suffix) <= 4:
                name_len = len(word) - len(suffix)
                break
        if name_len is None:
            after = text[m.end() : m.end() + 5].lstrip()
            if any(after.startswith(s) for s in sn._HANGUL_AFTER.split("|")) and len(word) <= 4:
                name_len = len(word)
            elif sn._LABELS_HANGUL.search(before) and len(word) in (2, 3, 4):
                name_len = len(word) if len(word) <= 3 else 3
            elif len(word) == 3 and word[1:] in given:
                name_len = 3
            # (and since 2026-12-06: a known given name with a case particle written on)
            elif (
                len(word) == 4
                and word[1:3] in given
                and (word[3] in "이가은는을를의도와과랑" or text[start + 3 : start + 5] in
                     ("에게", "한테", "께서", "하고", "이랑"))
            ):  # fmt: skip
                name_len = 3
        if name_len is not None and name_len >= 2:
            yield start, start + name_len


def _reference_isolated(text: str) -> Iterator[tuple[int, int]]:
    """script_names._isolated as it was before its word list became a tuple."""
    sn = script_names
    cjk_family, hangul_family, _, _ = sn._lists()
    for pattern, family in ((sn._HAN_TOKEN, cjk_family), (sn._HANGUL_TOKEN, hangul_family)):
        for m in pattern.finditer(text):
            word = m.group()
            if not (word[:1] in family or word[:2] in family):
                continue
            if any(c in sn._NEVER_IN_NAMES for c in word) or any(
                word.startswith(w) for w in sn._HANGUL_NOT_NAMES
            ):
                continue
            around = text[max(0, m.start() - 24) : m.start()] + " " + text[m.end() : m.end() + 24]
            if sn._EAST_ASIAN.search(around) or not sn._LATIN_WORD.search(around):
                continue
            yield m.start(), m.end()


def test_hangul_and_isolated_names_are_what_they_were() -> None:
    cjk_family, hangul_family, hangul_given, _ = script_names._lists()
    hangul = isolated = 0
    for text in _texts():
        expected = list(_reference_hangul(text))
        found = script_names._hangul(text, hangul_family, hangul_given)
        assert [(s.start, s.end) for s in found] == expected, text
        hangul += len(expected)
        expected = list(_reference_isolated(text))
        found = script_names._isolated(text, cjk_family, hangul_family)
        assert [(s.start, s.end) for s in found] == expected, text
        isolated += len(expected)
    assert hangul > 100
    assert isolated > 20


def test_words_in_capitals_start_or_continue_no_latin_name() -> None:
    """find_persons reads a word as capitalised (its check is written inline in the loop)
    when its first letter is a capital and it is not all capitals, or it is one capital:
    on the sets, in capitals and with every other word in capitals, no name it finds holds
    a word of two or more capitals (but those in capitals after a label: Passenger: MR X Y)."""
    found = 0
    for path in sorted(DATA_DIR.glob("*.txt")):
        for doc in load_documents(path):
            alternate = " ".join(
                w.upper() if k % 2 else w for k, w in enumerate(doc.text.split(" "))
            )
            for text in (doc.text, doc.text.upper(), alternate):
                # (names in capitals after a label are found on purpose, by another rule)
                labelled = {(s.start, s.end) for s in names._labelled_capitals(text)}
                for span in names.find_persons(text, frozenset()):
                    if (span.start, span.end) in labelled:
                        continue
                    value = text[span.start : span.end]
                    assert not any(
                        len(w) > 1 and w.isupper() for w in re.findall(r"[^\W\d_]+", value)
                    ), value
                    found += 1
    assert found > 1000


def _reference_cue_before(before: str, cues: frozenset[str]) -> bool:
    words = before.rstrip(" ,:\n").lower().split()[-3:]
    return any(" ".join(words[k:]).lstrip("(\"'") in cues for k in range(len(words)))


def test_cue_phrases_are_what_they_were() -> None:
    cue_lists = (names._CUE_PHRASES, names._STRONG_CUES, names._PERSON_CUES, names._SIGN_OFFS)
    hits = 0
    for text in _texts():
        for at in range(0, len(text), 7):
            before = text[max(0, at - 30) : at]
            for cues in cue_lists:  # the same text asked again: the memo's answer
                expected = _reference_cue_before(before, cues)
                assert names._cue_before(before, cues) == expected, before
                hits += expected
    assert hits > 100
    # texts that end alike, asked one after the other
    assert names._cue_before("Signed by ", names._STRONG_CUES)
    assert not names._cue_before("Passed by ", names._STRONG_CUES)
    assert names._cue_before("Signed by ", names._STRONG_CUES)


def test_version_context_is_what_its_search_says() -> None:
    hits = 0
    for text in (*_texts(), "build\n", "V \n", "fw\t", "ver. ", "==", "Revision \n", "x~="):
        for at in range(len(text) + 1):
            expected = bool(detectors._VERSION_BEFORE.search(text[max(0, at - 12) : at]))
            assert detectors._version_context(text, at) == expected, text[max(0, at - 12) : at]
            hits += expected
    assert hits > 100


def test_finditer_from_goes_on_after_a_match_and_skips_starts_inside_it() -> None:
    pattern = re.compile(r"ab+")
    text = "abbb ab abbbb"
    starts = list(range(len(text)))
    assert _spans(prefilter.finditer_from(pattern, text, starts)) == _spans(pattern.finditer(text))
    # a start that is not given is not tried
    assert _spans(prefilter.finditer_from(pattern, text, [0, 8])) == [((0, 4),), ((8, 13),)]


def test_keyword_starts_are_the_folded_roots_and_the_positions_before() -> None:
    assert prefilter.keyword_starts("x ſecret", ["secret"], 1) == [1, 2]
    assert prefilter.keyword_starts("TOKEN token", ["token"]) == [0, 6]
    assert prefilter.literal_starts("a:b", [":"], 4) == [0, 1]
