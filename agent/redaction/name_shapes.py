"""Whether a Latin word has the shape of a romanized name from a syllabic system.

Gazetteers never hold every given name: Chinese, Japanese, Korean and West African given
names are built from syllables, so most of them are in no list. What a list cannot hold, the
shape can tell: a word that splits entirely into

- Hanyu Pinyin syllables (``Xiuying`` = xiu + ying; ``Zhiqiang``);
- Japanese morae in Hepburn (``Kazuyoshi`` = ka + zu + yo + shi);
- Korean syllables in the Revised or McCune-style romanization (``Minjun``, ``Seo-yeon``);
- open (consonant + vowel) syllables as in Yoruba, Igbo, Hausa, Akan names (``Oluwaseun``,
  ``Chukwuemeka``, ``Adebayo``)

is *name-shaped*. Shape alone is never enough (``Banana`` is open-syllabled): the detector
pairs it with a known name next to it or a context cue (see :mod:`agent.redaction.names`).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache, lru_cache

_PINYIN_INITIALS = (
    "b p m f d t n l g k h j q x zh ch sh r z c s y w".split()  # noqa: SIM905
)
_PINYIN_FINALS = (
    "a o e ai ei ao ou an en ang eng ong i ia ie iao iu ian in iang ing iong u ua uo uai "  # noqa: SIM905
    "ui uan un uang ue v ve".split()
)
# Syllables without an initial.
_PINYIN_BARE = frozenset("a o e ai ei ao ou an en ang eng er".split())  # noqa: SIM905


@cache
def _pinyin_re() -> re.Pattern[str]:
    syllables = set(_PINYIN_BARE)
    for i in _PINYIN_INITIALS:
        for f in _PINYIN_FINALS:
            if i in ("j", "q", "x") and not (f.startswith(("i", "u", "v"))):
                continue
            if i in ("zh", "ch", "sh", "r", "z", "c", "s") and f.startswith(
                ("ia", "ie", "in", "io")
            ):
                continue
            if i == "w" and not f.startswith(("a", "o", "e", "u")):
                continue
            syllables.add(i + f)
    alt = "|".join(sorted(syllables, key=len, reverse=True))
    return re.compile(rf"(?:{alt})(?:['-]?(?:{alt})){{0,2}}")


_MORA = (
    r"(?:kk|tt|pp|ss|cch|tch)?"
    r"(?:ky|gy|sh|ch|j|ny|hy|by|py|my|ry|ts|[kgsztdnhbpmyrwf])?"
    r"(?:a|i|u|e|o)(?:u|i)?(?:n(?![aiueoy]))?"
)
_ROMAJI = re.compile(rf"(?:{_MORA}){{2,7}}")
_KOREAN_SYL = (
    r"(?:kk|tt|pp|ss|jj|ch|sh|g|k|n|d|t|r|l|m|b|p|s|j|h)?"
    r"(?:yeo|yae|wae|woo|ae|ya|eo|ye|wa|oe|yo|wo|we|wi|yu|eu|ui|ee|oo|a|e|o|u|i)"
    r"(?:ng|k|n|t|l|m|p)?"
)
_KOREAN = re.compile(rf"{_KOREAN_SYL}(?:-?{_KOREAN_SYL})?")
_OPEN_SYL = (
    r"(?:gb|kp|ch|sh|ny|kw|gw|ng|nn|nw|nk|mb|nd|ts|[bdfghjklmnprstvwyz])?(?:[aeiou])"
    r"(?:[nm](?![aeiou]))?"
)
_OPEN = re.compile(rf"(?:{_OPEN_SYL}){{2,8}}")


def pinyin_shaped(word: str) -> bool:
    """One to three pinyin syllables (``Wei``, ``Xiuying``, ``Xiao-ming``)."""
    return _pinyin_re().fullmatch(word.lower()) is not None


def romaji_shaped(word: str) -> bool:
    """Two to seven Japanese morae (``Haruto``, ``Kazuyoshi``, ``Shun``)."""
    return _ROMAJI.fullmatch(word.lower()) is not None


def korean_shaped(word: str) -> bool:
    """One or two Korean syllables, joined or hyphenated (``Minjun``, ``Seo-yeon``)."""
    return _KOREAN.fullmatch(word.lower()) is not None


def open_syllabled(word: str) -> bool:
    """Two to eight open syllables (``Kofi``, ``Oluwaseun``, ``Nwachukwu``, ``Nnamdi``)."""
    return _OPEN.fullmatch(word.lower()) is not None


def pinyin_only(word: str) -> bool:
    """Pinyin-shaped and no other shape (``Xiuying``; also ``Mailing``, ``Long``)."""
    return pinyin_shaped(word) and not (
        romaji_shaped(word) or korean_shaped(word) or open_syllabled(word)
    )


def warm_up() -> None:
    """Builds the pinyin syllables' pattern (once per process): left to the first
    name-shaped word, it cost that request about 10 ms."""
    _pinyin_re()


@lru_cache(maxsize=65536)
def name_shaped(word: str) -> bool:
    """Any of the shapes above, for a capitalised word of at least two letters (tone marks
    and dots below are set aside: Wáng, Adéyẹmí)."""
    if len(word) < 2 or not word[0].isupper() or not word[1:].replace("-", "").islower():
        return False
    if not word.isascii():
        word = "".join(
            c for c in unicodedata.normalize("NFD", word) if not unicodedata.combining(c)
        )
    return pinyin_shaped(word) or romaji_shaped(word) or korean_shaped(word) or open_syllabled(word)
