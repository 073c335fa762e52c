"""Writes ``agent/redaction/data/gazetteer.json`` from Faker's locale providers.

Run once by a developer (Faker is a dev/bench dependency, never needed on an edge box):
``.venv/bin/python -m agent.redaction.build_gazetteer``. The file holds given names, family
names and street words from every Latin-script Faker locale; the agent reads only the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

OUT = Path(__file__).parent / "data" / "gazetteer.json"
# Street words come only from locales whose address formats the detector knows.
STREET_LOCALES = frozenset(
    [
        "en_US",
        "en_GB",
        "en_AU",
        "en_CA",
        "en_IE",
        "en_NZ",
        "de_DE",
        "de_AT",
        "de_CH",
        "fr_FR",
        "fr_CA",
        "fr_CH",
        "it_IT",
        "es_ES",
        "es_MX",
        "pt_PT",
        "pt_BR",
        "nl_NL",
        "nl_BE",
    ]
)
_LATIN_WORD = re.compile(r"^[A-Za-zÀ-ÖØ-öø-ÿĀ-ž][A-Za-zÀ-ÖØ-öø-ÿĀ-ž'\u2019.\-]*$")


def _words(values: object) -> set[str]:
    items = values.keys() if isinstance(values, dict) else values
    out = set()
    for v in items if isinstance(items, Iterable) else ():
        if isinstance(v, str):
            for part in v.replace("-", " ").split():
                if _LATIN_WORD.match(part) and len(part) >= 2:
                    out.add(part)
    return out


def build() -> dict[str, list[str]]:
    from faker import Faker
    from faker.config import AVAILABLE_LOCALES

    given: set[str] = set()
    family: set[str] = set()
    street_suffixes: set[str] = set()
    street_prefixes: set[str] = set()
    for loc in sorted(AVAILABLE_LOCALES):
        try:
            fake = Faker(loc)
        except AttributeError:
            continue
        for prov in fake.providers:
            mod = type(prov).__module__
            if ".person." in mod:
                for attr in ("first_names", "first_names_female", "first_names_male"):
                    given |= _words(getattr(prov, attr, ()))
                for attr in ("last_names", "male_last_names", "unisex_last_names"):
                    family |= _words(getattr(prov, attr, ()))
            elif ".address." in mod and loc in STREET_LOCALES:
                for attr in ("street_suffixes", "street_suffixes_long", "street_suffixes_short"):
                    street_suffixes |= {s for s in getattr(prov, attr, ()) if isinstance(s, str)}
                street_prefixes |= {
                    s for s in getattr(prov, "street_prefixes", ()) if isinstance(s, str)
                }
    return {
        "given": sorted(given),
        "family": sorted(family),
        "street_suffixes": _clean(street_suffixes),
        "street_prefixes": _clean(street_prefixes),
    }


def _clean(words: set[str]) -> list[str]:
    return sorted({w.strip() for w in words if len(w.strip()) >= 2 and "{" not in w})


def main() -> None:
    data = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(OUT, {k: len(v) for k, v in data.items()})


if __name__ == "__main__":
    main()
