# ruff: noqa: RUF001 (full-width colons and CJK honorifics are meant)
"""Person names written in scripts without capital letters: Han, kana, Hangul, Arabic,
Devanagari and the other caseless scripts.

Capitalisation is what finds a Latin or Cyrillic name; these scripts have none, and a single
Han surname (王, 林, 高) is also an ordinary word. So a name here needs a known surname
(Faker's lists, ``cjk_family`` / ``hangul_family`` / ``family`` in the gazetteer) **and** a
context cue:

- Han and kana: a surname and one or two further characters, with an honorific after
  (先生, 女士, 小姐, 様, さん, 氏, 君, 殿 ...) or a label before (姓名, 氏名, 名前, 收件人,
  联系人, 尊敬的, 宛先, ``Name:``, ``Dear`` ...); a known surname of two or more characters
  and a space then the given name (``木村 陽一``) needs no cue;
- Hangul: a word of two to four syllables starting with a known surname, with an honorific or
  particle of address after (님, 씨, 고객님, 선생님, 귀하 ...) or a label before (이름, 성명,
  고객명, 수령인, 예금주 ...), or whose remaining syllables are a known given name;
- Arabic, Devanagari, Bengali, Tamil, Thai, Hebrew, Georgian, Armenian ... (space-separated
  words): two or three words of the script, the first a known given name and the next a
  known name, or any known name after a label or an honorific (السيد, श्री, ...).

Not covered: Chinese or Japanese names whose surname is in no list, names in these scripts
without any cue, and telling Japanese from Chinese readings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from agent.redaction.detectors import PERSON, Span

_DATA = Path(__file__).parent / "data" / "gazetteer.json"

_HAN = "\u3005\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3041-\u3096\u30a1-\u30fa\u30fc"
_HANGUL = "\uac00-\ud7a3"
_HONORIFIC_AFTER_CJK = (
    "先生|女士|小姐|老师|同学|经理|經理|总|總|医生|醫生|教授|阁下|閣下|"
    "様|さま|さん|氏|君|殿|くん|ちゃん|先輩|部長|課長|社長"
)
_LABELS_CJK = (
    "姓名|氏名|名前|お名前|收件人|收货人|收貨人|联系人|聯絡人|联系|客户|客戶|患者|病人|"
    "尊敬的|亲爱的|親愛的|致|宛先|宛名|担当|担当者|申请人|申請人|持卡人|账户名|帳戶名|用户|"
    "寄件人|发件人|送付先|お届け先|ご依頼主|受取人|"
    "name|name:|dear|customer|patient|recipient|attn|contact|holder|mr|ms|mrs|dr"
)
_CJK_RUN = re.compile(rf"[{_HAN}]{{1,3}}[ \u3000]?[{_HAN}{_KANA}]{{1,3}}")
_LABEL_BEFORE = re.compile(rf"(?i:(?:{_LABELS_CJK}))\s*[:：]?\s*$")
_HONORIFIC = re.compile(rf"(?:{_HONORIFIC_AFTER_CJK})")

_HANGUL_WORD = re.compile(rf"(?<![{_HANGUL}])[{_HANGUL}]{{2,4}}")
_HANGUL_AFTER = (
    "고객님|선생님|교수님|과장님|부장님|대리님|사장님|님|씨|귀하|고객|선생|과장|부장|대리|사장"
)
_HANGUL_PARTICLES = ("님", "씨")
_LABELS_HANGUL = re.compile(
    r"(?i:(?:이름|성명|고객명|수령인|받는\s?분|받는\s?사람|예금주|담당자|환자|보내는\s?분|신청인|"
    r"name|dear|customer|patient|recipient|attn|contact|holder))\s*[:：]?\s*$"
)

_CASELESS_WORD = re.compile(
    r"[\u0600-\u06ff\u0750-\u077f\u0590-\u05ff\u0900-\u0dff\u0e00-\u0e7f\u10a0-\u10ff"
    r"\u0530-\u058f\u1200-\u137f][\u0600-\u06ff\u0750-\u077f\u0590-\u05ff\u0900-\u0dff"
    r"\u0e00-\u0e7f\u10a0-\u10ff\u0530-\u058f\u1200-\u137f\u200c\u200d]*"
)
_HONORIFICS_CASELESS = frozenset(
    "السيد السيدة الأستاذ الأستاذة الدكتور الدكتورة د. الشيخ السيدة/ السادة "  # noqa: SIM905
    "श्री श्रीमती सुश्री डॉ. डॉ कुमारी मिस्टर "
    "শ্রী শ্রীমতী ডা. திரு திருமதி ഡോ. ശ്രീ คุณ นาย นาง นางสาว מר גב' ד\"ר".split()
)
_LABELS_CASELESS = re.compile(
    r"(?i:(?:name|dear|customer|patient|recipient|attn|contact|holder|signed|"
    r"الاسم|اسم العميل|المستلم|عزيزي|عزيزتي|नाम|प्रिय|ग्राहक|नाम:|ชื่อ|שם|"
    r"mr|mrs|ms|dr))\s*[:：]?\s*$"
)


@cache
def _lists() -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    return (
        frozenset(data.get("cjk_family", ())),
        frozenset(data.get("hangul_family", ())),
        frozenset(data.get("hangul_given", ())),
        frozenset(data["given"]) | frozenset(data["family"]),
    )


def warm_up() -> None:
    _lists()


_NON_LATIN = re.compile(
    r"[\u0590-\u0dff\u0e00-\u0e7f\u10a0-\u10ff\u0530-\u058f\u3040-\ud7a3\uf900-\ufaff]"
)


def find_script_persons(text: str) -> Iterator[Span]:
    """Names in caseless scripts (see the module docstring)."""
    if not _NON_LATIN.search(text):
        return
    cjk_family, hangul_family, hangul_given, known = _lists()
    yield from _cjk(text, cjk_family)
    yield from _hangul(text, hangul_family, hangul_given)
    yield from _caseless(text, known)


def _cjk(text: str, family: frozenset[str]) -> Iterator[Span]:
    for m in _CJK_RUN.finditer(text):
        run = m.group()
        start = m.start()
        # the surname: the longest known prefix (two characters before one)
        sur = run[:2] if run[:2] in family else run[:1] if run[:1] in family else ""
        if not sur:
            continue
        rest = run[len(sur) :]
        spaced = rest.startswith((" ", "\u3000"))
        rest = rest.lstrip(" \u3000")
        if not rest:
            continue
        before = text[max(0, start - 12) : start]
        after = text[m.end() : m.end() + 3]
        # an honorific may have been swallowed by the run (王先生): give it back
        h = _HONORIFIC.search(run, len(sur) + 1)
        if h is not None and h.end() == len(run):
            end = start + h.start()
            honorific = True
        else:
            end = m.end()
            honorific = _HONORIFIC.match(after) is not None
            if len(rest) > 2 and not spaced:
                end = start + len(sur) + (1 if spaced else 0) + 2
        if end - start - len(sur) < 1:
            continue
        labelled = _LABEL_BEFORE.search(before) is not None
        if honorific or labelled or (spaced and len(sur) >= 2):
            yield Span(start, end, PERSON)


def _hangul(text: str, family: frozenset[str], given: frozenset[str]) -> Iterator[Span]:
    for m in _HANGUL_WORD.finditer(text):
        word = m.group()
        start = m.start()
        if word[0] not in family:
            continue
        before = text[max(0, start - 12) : start]
        name_len = None
        for suffix in sorted(_HANGUL_AFTER.split("|"), key=len, reverse=True):
            if word.endswith(suffix) and 2 <= len(word) - len(suffix) <= 4:
                name_len = len(word) - len(suffix)
                break
        if name_len is None:
            after = text[m.end() : m.end() + 5].lstrip()
            if any(after.startswith(s) for s in _HANGUL_AFTER.split("|")) and len(word) <= 4:
                name_len = len(word)
            elif _LABELS_HANGUL.search(before) and len(word) in (2, 3, 4):
                name_len = len(word) if len(word) <= 3 else 3
            elif len(word) == 3 and word[1:] in given:
                name_len = 3
        if name_len is not None and name_len >= 2:
            yield Span(start, start + name_len, PERSON)


def _caseless(text: str, known: frozenset[str]) -> Iterator[Span]:
    words = list(_CASELESS_WORD.finditer(text))
    i = 0
    while i < len(words):
        w = words[i]
        j = i + 1
        # following words of the script, separated by single spaces
        while j < len(words) and j - i < 3 and text[words[j - 1].end() : words[j].start()] == " ":
            j += 1
        run = words[i:j]
        before = text[max(0, w.start() - 24) : w.start()]
        prev = text[: w.start()].split()[-1:] if w.start() else []
        cue = _LABELS_CASELESS.search(before) is not None or (
            bool(prev) and prev[0] in _HONORIFICS_CASELESS
        )
        if w.group() in _HONORIFICS_CASELESS:
            i += 1
            continue
        names = [x for x in run if x.group() in known]
        if len(run) >= 2 and run[0].group() in known and run[1].group() in known:
            end = max(x.end() for x in names if x.end() <= run[-1].end())
            yield Span(w.start(), end, PERSON)
            i = j
            continue
        if cue and names:
            yield Span(w.start(), run[-1].end(), PERSON)
            i = j
            continue
        i += 1
