"""One regular expression for a set of words, shaped as a trie.

Python's ``re`` tries the branches of ``a|b|c`` one after another; for hundreds of words
that is hundreds of attempts at every position. A trie shares prefixes, so at most one
branch per character is tried.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def trie_regex(words: Iterable[str]) -> str:
    """A non-capturing pattern matching exactly the given words (longest first)."""
    root: dict[str, dict] = {}  # type: ignore[type-arg]
    for word in words:
        if not word:
            continue
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # end of a word
    return _pattern(root) or "(?!)"


def _pattern(node: dict[str, dict]) -> str:  # type: ignore[type-arg]
    ends = "" in node
    branches = [re.escape(ch) + _pattern(child) for ch, child in sorted(node.items()) if ch]
    if not branches:
        return ""
    if all(len(b) == 1 for b in branches):
        body = branches[0] if len(branches) == 1 else "[" + "".join(branches) + "]"
    else:
        body = "(?:" + "|".join(branches) + ")"
    return f"(?:{body})?" if ends else body
