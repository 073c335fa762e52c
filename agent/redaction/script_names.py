# ruff: noqa: RUF001, RUF003 (full-width colons and CJK honorifics are meant)
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

A known family name right before a listed two-letter given name (张建国, 王秀英, 佐藤健一) is
a name without a cue, unless a place letter follows (建国路, 建国门). In Japanese text a
listed two-character surname opening a run of kanji, with up to two more,
before a particle (佐藤健一が, 高橋から) is a name too (not a prefecture or large city); in
Korean text a family syllable and a listed given name with a case particle on (박서준이,
김민수에게); in Devanagari a known name before ने or को; a known name of a caseless script
alone in text of another script (I spoke with محمد), or any word of it after a greeting.

Not covered: Chinese or Japanese names whose surname is in no list, Chinese names without any
cue (a single Han surname is an ordinary character), and telling Japanese from Chinese
readings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from itertools import chain

from agent.redaction import gazetteer_file
from agent.redaction.detectors import PERSON, Span
from agent.redaction.prefilter import finditer_from, keyword_starts, marks
from agent.redaction.trie import trie_regex

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
    "寄件人|发件人|送付先|お届け先|ご依頼主|受取人|我是|我叫|名叫|叫做|担当の|私は|わたしは|"
    "name|name:|dear|customer|patient|recipient|attn|contact|holder|mr|ms|mrs|dr"
)
_CJK_RUN = re.compile(rf"[{_HAN}]{{1,3}}[ \u3000]?[{_HAN}{_KANA}]{{1,3}}")
_LABEL_BEFORE = re.compile(rf"(?i:(?:{_LABELS_CJK}))\s*[:：]?\s*$")
_HONORIFIC = re.compile(rf"(?:{_HONORIFIC_AFTER_CJK})")

# Lookbehinds after the first character, not before it (what is before the first character is
# checked with a two-character lookbehind): re can then skip ahead to a possible first
# character instead of trying every position; the same matches.
_HANGUL_WORD = re.compile(rf"[{_HANGUL}](?<![{_HANGUL}][\s\S])[{_HANGUL}]{{1,3}}")
_HANGUL_AFTER = (
    "고객님|선생님|교수님|과장님|부장님|대리님|사장님|님|씨|귀하|고객|선생|과장|부장|대리|사장"
)
_HANGUL_PARTICLES = ("님", "씨")
_LABELS_HANGUL = re.compile(
    r"(?i:(?:저는|제 이름은|이름은|이름|성명|고객명|수령인|받는\s?분|받는\s?사람|예금주|담당자|"
    r"환자|보내는\s?분|신청인|"
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
# Hindi's ergative and dative postpositions (a doer in the past tense, someone told, given
# or called); not से, का, की, के, which things take as often
_AGENT_MARKERS = frozenset(["ने", "को"])
# the thanks, greetings and vocative of _LABELS_CASELESS, never part of the name after them
_CASELESS_CUE_WORDS = frozenset(
    "شكرا شكراً مرحبا أهلا يا धन्यवाद नमस्ते शुक्रिया תודה שלום היי ধন্যবাদ நன்றி".split()  # noqa: SIM905
)
_LABELS_CASELESS = re.compile(
    r"(?i:(?<!\w)(?:name|dear|customer|patient|recipient|attn|contact|holder|signed|"
    r"الاسم|اسم العميل|المستلم|عزيزي|عزيزتي|नाम|प्रिय|ग्राहक|नाम:|ชื่อ|שם|"
    r"mr|mrs|ms|dr|"
    # thanks, greetings and the vocative (شكرا يا فاطمة, धन्यवाद, सुनीता!, תודה, שרה!)
    r"شكرا|شكراً|مرحبا|أهلا|يا|धन्यवाद|नमस्ते|शुक्रिया|תודה|שלום|היי|ধন্যবাদ|நன்றி))"
    r"\s*[:：,،]?\s*$"
)


@cache
def _lists() -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    data = gazetteer_file.read()
    return (
        frozenset(data.get("cjk_family", ())),
        frozenset(data.get("hangul_family", ())),
        frozenset(data.get("hangul_given", ())),
        frozenset(data["given"]) | frozenset(data["family"]),
    )


@cache
def _listed_given_pattern() -> re.Pattern[str]:
    """The listed Chinese and Japanese given names of two Han letters (Faker's zh_CN, zh_TW
    and ja_JP: 秀英, 建国, 健一 ...), as one pattern."""
    given = gazetteer_file.read().get("cjk_given", ())
    two = [g for g in given if len(g) == 2 and all(_is_han(c) for c in g)]
    return re.compile(trie_regex(two))


def warm_up() -> None:
    _lists()
    _listed_given_pattern()


_NON_LATIN = re.compile(
    r"[\u0590-\u0dff\u0e00-\u0e7f\u10a0-\u10ff\u0530-\u058f\u3040-\ud7a3\uf900-\ufaff]"
)


def find_script_persons(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    """Names in caseless scripts (see the module docstring)."""
    found = marks(text) if found is None else found
    if "non_latin" not in found or not _NON_LATIN.search(text):
        return
    cjk_family, hangul_family, hangul_given, known = _lists()
    # each part only where the text has letters of its script (prefilter.marks)
    if "han" in found:
        yield from _cjk(text, cjk_family)
    if "hangul" in found:
        yield from _hangul(text, hangul_family, hangul_given)
    if "han" in found or "hangul" in found:
        yield from _isolated(text, cjk_family, hangul_family)
    if "caseless" in found:
        yield from _caseless(text, known)
        yield from _isolated_caseless(text, known)


_HONORIFIC_AT = re.compile(
    "|".join(
        re.escape(h[0]) + rf"(?<=[{_HAN}][\s\S])" + re.escape(h[1:])
        for h in _HONORIFIC_AFTER_CJK.split("|")
    )
)
_LABEL_AT = re.compile(
    rf"(?:{_LABELS_CJK.split('|name')[0]})[ \u3000]?[:：]?[ \u3000]?(?=[{_HAN}])"
)
_LATIN_LABEL_AT = re.compile(
    r"(?i:\b(?:name|dear|customer|patient|recipient|attn|contact|holder|mr|ms|mrs|dr)\.?)"
    rf"[ \u3000]?[:：]?[ \u3000]?(?=[{_HAN}])"
)
# Every word of _LATIN_LABEL_AT starts with one of these (folded).
_LATIN_LABEL_ROOTS = (
    "name", "dear", "customer", "patient", "recipient", "attn", "contact", "holder", "mr",
    "ms", "dr",
)  # fmt: skip


def latin_label_matches(text: str) -> Iterator[re.Match[str]]:
    """``_LATIN_LABEL_AT.finditer(text)``, tried only where one of its words starts."""
    return finditer_from(_LATIN_LABEL_AT, text, keyword_starts(text, _LATIN_LABEL_ROOTS))


_SPACED = re.compile(
    rf"([{_HAN}](?<![{_HAN}{_KANA}][\s\S])[{_HAN}]{{1,2}})[ \u3000]([{_HAN}{_KANA}]{{1,3}})"
    rf"(?![{_HAN}{_KANA}])"
)


def _cjk(text: str, family: frozenset[str]) -> Iterator[Span]:
    # 1. an honorific after a name (王秀英女士, 张先生, 高橋さん): the longest run before it that
    #    starts with a known surname, at most four characters
    for m in _HONORIFIC_AT.finditer(text):
        end = m.start()
        for length in (4, 3, 2, 1):
            start = end - length
            if start < 0:
                continue
            cand = text[start:end]
            if not all(_is_han(c) for c in cand) or any(c in _NEVER_IN_NAMES for c in cand):
                continue
            if cand[:2] in family or cand[:1] in family:
                yield Span(start, end, PERSON)
                break
    # 2. a label before a name (收件人：李伟, 氏名: 佐藤健一, Dear 王伟): a known surname and up
    #    to two more characters (three after a two-character surname)
    for m in chain(_LABEL_AT.finditer(text), latin_label_matches(text)):
        start = m.end()
        sur = 2 if text[start : start + 2] in family else 1 if text[start] in family else 0
        if not sur:
            continue
        end = start + sur
        if text[end : end + 1] in (" ", "\u3000"):
            end += 1
        given = 0
        while (
            end < len(text)
            and given < 2 + (sur == 2)
            and _is_han(text[end])  # kana after a name is a particle (山田です)
        ):
            if _HONORIFIC.match(text, end):
                break
            end += 1
            given += 1
        if given or sur == 2:  # 私は山田です: a two-character family name alone
            yield Span(start, end if given else start + sur, PERSON)
    # 3. a known surname of two or more characters, a space, a given name (木村 陽一)
    for m in _SPACED.finditer(text):
        if m.group(1) in family or m.group(1)[:2] in family:
            h = _HONORIFIC.search(m.group(2))
            end = m.start(2) + h.start() if h is not None and h.start() > 0 else m.end()
            yield Span(m.start(), end, PERSON)
    # 4. a known family name right before a listed given name of two Han letters (张建国的订单,
    #    王秀英明天来, 佐藤健一が): no cue needed, two-letter given names are rarely words
    for m in _listed_given_pattern().finditer(text):
        at = m.start()
        if text[m.end() : m.end() + 1] in _PLACE_AFTER_CJK:
            continue  # 建国路, 建国门, 中山公园: streets and places named like people
        if at >= 2 and text[at - 2 : at] in family and _opens_here(text, at - 2):
            yield Span(at - 2, m.end(), PERSON)
        elif (
            at >= 1
            and text[at - 1] in family
            and text[at - 1] not in _NEVER_IN_NAMES
            and text[at - 1] not in _NOT_A_FAMILY_HERE
            and _opens_here(text, at - 1)
        ):
            yield Span(at - 1, m.end(), PERSON)
    # 5. a known two-character surname opening a run of Han letters, up to two more, then a
    #    Japanese particle (佐藤健一が, 高橋から, 鈴木の): not a prefecture or a city that is
    #    also a surname (山口に行く), not a one-character surname (高速の is "high speed's")
    if _KANA_LETTER.search(text):
        for m in _two_char_surnames(family).finditer(text):
            if m.start() and _is_han(text[m.start() - 1]):
                continue  # inside a longer run of Han letters
            after = _GIVEN_THEN_PARTICLE.match(text, m.end())
            if after is None or m.group() in _PLACES_JA:
                continue
            if any(c in _NEVER_IN_NAMES for c in after.group()):
                continue
            yield Span(m.start(), after.end(), PERSON)


def _opens_here(text: str, at: int) -> bool:
    """A word may start at ``at``: the text starts there, or what is before is no Han letter
    or a function character (请张建国, 给王秀英), not a letter that makes a word with the
    family name's (主张建国 is 主张 + 建国, "advocates founding a state")."""
    return at == 0 or not _is_han(text[at - 1]) or text[at - 1] in _NEVER_IN_NAMES


# A character after a name that makes it a place: a road, street, gate, lane, village,
# district, city, station, bridge, square, park, hospital, school, hotel, building, temple,
# lake, mountain, river, town
_PLACE_AFTER_CJK = frozenset(
    "路街道门門巷里村镇鎮区區县縣市省站桥橋场場园園院学學店馆館厦廈楼樓寺庙廟湖山河江町"
)
_KANA_LETTER = re.compile(rf"[{_KANA}]")
# up to two Han letters of a given name, then a particle
_GIVEN_THEN_PARTICLE = re.compile(rf"[{_HAN}]{{0,2}}(?=が|は|を|に|と|の|から|も|へ|より|まで)")


@cache
def _two_char_surnames(family: frozenset[str]) -> re.Pattern[str]:
    """The listed family names of two Han letters, as one pattern."""
    two = sorted(f for f in family if len(f) == 2 and all(_is_han(c) for c in f))
    return re.compile("|".join(map(re.escape, two)) or "(?!)")


# Japan's prefectures and largest cities whose names are surnames too (山口, 石川, 福島 ...)
# (not 松本, a city but far more often a person)
_PLACES_JA = frozenset(
    "北海 青森 岩手 宮城 秋田 山形 福島 茨城 栃木 群馬 埼玉 千葉 東京 新潟 富山 石川 福井 "  # noqa: SIM905
    "山梨 長野 岐阜 静岡 愛知 三重 滋賀 京都 大阪 兵庫 奈良 鳥取 島根 岡山 広島 山口 徳島 香川 "
    "愛媛 高知 福岡 佐賀 長崎 熊本 大分 宮崎 沖縄 横浜 札幌 神戸 仙台 川崎 福山 浜松 金沢 "
    "長岡 高松 松山 函館 旭川 盛岡 水戸 前橋 高崎 甲府 津山 米子 松江 下関 佐世保 宇都宮 "
    "名古 鹿児 和歌 神奈 日本 中国 韓国 台湾 香港 上海 北京 "
    "清水 小川".split()  # and surnames that are ordinary words: clear water, a brook
)
# Family-name characters that before a given name are more often the end of another word: a
# district (朝阳区建国门), function characters
_NOT_A_FAMILY_HERE = frozenset("区區市省县縣镇鎮村路街")  # (and _NEVER_IN_NAMES, below)
# Function characters and the labels' own characters: never part of a name found here.
_NEVER_IN_NAMES = frozenset(
    "的了是在和与與给給请請向对對把被从從为為您你我他她们們这這那个個也都就很敬尊爱愛致"
)


_HAN_TOKEN = re.compile(rf"[{_HAN}]{{2,4}}")
_HANGUL_TOKEN = re.compile(rf"[{_HANGUL}]{{2,4}}")
_EAST_ASIAN = re.compile(rf"[{_HAN}{_KANA}{_HANGUL}]")
_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")


def _isolated(
    text: str, cjk_family: frozenset[str], hangul_family: frozenset[str]
) -> Iterator[Span]:
    """A short Han or Hangul word alone in text of another script ("Hi 王秀英, your order";
    "Customer 김민준 called"): there it is a name when it starts with a known surname."""
    for pattern, family in ((_HAN_TOKEN, cjk_family), (_HANGUL_TOKEN, hangul_family)):
        for m in pattern.finditer(text):
            word = m.group()
            if not (word[:1] in family or word[:2] in family):
                continue
            if any(c in _NEVER_IN_NAMES for c in word) or word.startswith(_NOT_NAME_STARTS):
                continue
            # no other East Asian letter within 24 characters, and Latin words around
            around = text[max(0, m.start() - 24) : m.start()] + " " + text[m.end() : m.end() + 24]
            if _EAST_ASIAN.search(around) or not _LATIN_WORD.search(around):
                continue
            yield Span(m.start(), m.end(), PERSON)


def _is_han(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" or ch == "\u3005"


def _is_kana(ch: str) -> bool:
    return "\u3041" <= ch <= "\u30fc"


# Words before an honorific that are not names (고객님 is "dear customer").
_HANGUL_NOT_NAMES = frozenset(
    "고객 선생 교수 과장 부장 대리 사장 회원 여러분 담당 기사 이용 관리 주임 팀장 원장 "  # noqa: SIM905
    "실장 이사 상무 전무 회장 의사 간호 환자 학생 손님 어머 아버 형 누나 언니 오빠 동생".split()
)


# the same words as tuples, for str.startswith and str.endswith (one call, not a loop)
_NOT_NAME_STARTS = tuple(_HANGUL_NOT_NAMES)
_HANGUL_AFTER_WORDS = tuple(_HANGUL_AFTER.split("|"))
_HANGUL_AFTER_LONGEST_FIRST = tuple(sorted(_HANGUL_AFTER_WORDS, key=len, reverse=True))


# Korean case particles written onto a name: subject, topic, object, possessive, "too",
# "and", "to", "from"
_CASE_PARTICLES = frozenset("이가은는을를의도와과랑")
_CASE_PARTICLES_2 = frozenset(["에게", "한테", "께서", "하고", "이랑"])


def _hangul(text: str, family: frozenset[str], given: frozenset[str]) -> Iterator[Span]:
    for m in _HANGUL_WORD.finditer(text):
        word = m.group()
        start = m.start()
        if word[0] not in family or word.startswith(_NOT_NAME_STARTS):
            continue
        before = text[max(0, start - 12) : start]
        name_len = None
        for suffix in _HANGUL_AFTER_LONGEST_FIRST:
            if word.endswith(suffix) and 2 <= len(word) - len(suffix) <= 4:
                name_len = len(word) - len(suffix)
                break
        if name_len is None:
            after = text[m.end() : m.end() + 5].lstrip()
            if after.startswith(_HANGUL_AFTER_WORDS) and len(word) <= 4:
                name_len = len(word)
            elif _LABELS_HANGUL.search(before) and len(word) in (2, 3, 4):
                name_len = len(word) if len(word) <= 3 else 3
            elif len(word) == 3 and word[1:] in given:
                name_len = 3
            elif (
                len(word) == 4
                and word[1:3] in given
                and (word[3] in _CASE_PARTICLES or text[start + 3 : start + 5] in _CASE_PARTICLES_2)
            ):
                name_len = 3  # 박서준이 취소했어요, 김민수에게: a known given name, a particle
        if name_len is not None and name_len >= 2:
            yield Span(start, start + name_len, PERSON)


_GREETING_BEFORE = re.compile(r"(?i:\b(?:hi|hello|hey|dear|thanks|thank you|cheers),?[ \t]*\Z)")


def _isolated_caseless(text: str, known: frozenset[str]) -> Iterator[Span]:
    """A name in Arabic, Hebrew, Devanagari, Thai, Georgian ... script alone in text of
    another script ("I spoke with محمد yesterday", "Thanks, प्रिया!"): a known name, or any
    word of the script after a greeting; its run of the script's words up to the last known
    one. Where other words of such a script are near (within 24 characters) the text is in
    that script, and :func:`_caseless` reads it."""
    words = list(_CASELESS_WORD.finditer(text))
    i = 0
    while i < len(words):
        j = i + 1
        while j < len(words) and j - i < 3 and text[words[j - 1].end() : words[j].start()] == " ":
            j += 1
        run = words[i:j]
        start, end = run[0].start(), run[-1].end()
        around = text[max(0, start - 24) : start] + " " + text[end : end + 24]
        i = j
        if _CASELESS_WORD.search(around) or not _LATIN_WORD.search(around):
            continue
        listed = [w for w in run if w.group() in known]
        if listed:
            yield Span(start, listed[-1].end(), PERSON)
        elif len(run) <= 2 and _GREETING_BEFORE.search(text, 0, start):
            yield Span(start, end, PERSON)


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
        if w.group() in _HONORIFICS_CASELESS or w.group() in _CASELESS_CUE_WORDS:
            i += 1
            continue
        names = [x for x in run if x.group() in known]
        if len(run) >= 2 and run[0].group() in known and run[1].group() in known:
            last = run[2] if len(run) >= 3 and run[2].group() in known else run[1]
            yield Span(w.start(), last.end(), PERSON)
            i = j
            continue
        if len(run) >= 2 and run[0].group() in known and run[1].group() in _AGENT_MARKERS:
            # a known name, then the postposition that marks a person who acts or is
            # addressed: प्रिया ने कहा, कृपया प्रिया को कॉल करें
            yield Span(w.start(), w.end(), PERSON)
            i = j
            continue
        if cue and names:
            # the first word and the next; a third only when it is a known name
            last = run[1] if len(run) >= 2 else run[0]
            if len(run) >= 3 and run[2].group() in known:
                last = run[2]
            yield Span(w.start(), last.end(), PERSON)
            i = j
            continue
        i += 1
