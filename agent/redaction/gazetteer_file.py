"""The gazetteer file (``data/gazetteer.json``, 3.3 MB), parsed once for every detector
that builds its lists from it (names.py's gazetteer, lexicon and East Asian family names,
script_names.py's lists): each used to read and parse it on its own, four parses of about
60 ms at every agent's start. The redactor's warm-up drops the parsed file once every list is
built (:func:`forget`); a list built later reads it again."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

PATH = Path(__file__).parent / "data" / "gazetteer.json"


@cache
def read() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(PATH.read_text(encoding="utf-8"))
    return data


def forget() -> None:
    """Drops the parsed file (about 30 MiB of lists the built ones no longer need)."""
    read.cache_clear()
