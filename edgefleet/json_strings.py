"""Strings a parsed JSON body may hold that no UTF-8 consumer takes.

JSON's ``\\ud800`` escape is valid syntax, and Python's json reads it into a string with a
lone surrogate, which cannot be encoded as UTF-8: the tokenizers, protobuf (the keys
section every agent is sent), SQLite and PostgreSQL all raise on it. Both HTTP APIs refuse
such a body up front with :func:`lone_surrogate_at`, naming the field, instead of failing
later (a 500, or a stored value that breaks every later use of it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["lone_surrogate_at"]


def _bad(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _shown(path: str) -> str:
    """``path`` as ASCII-safe text (a surrogate in a key as ``\\ud800``), cut short."""
    text = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 200 else text[:197] + "..."


def lone_surrogate_at(data: Any) -> str | None:
    """The dotted path (``messages.0.content``; ``""`` for the top level) of the first
    string, or object key, in ``data`` (parsed JSON) that holds a lone surrogate; None when
    there is none. Iterative: as deep as the JSON reader let ``data`` be."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _bad(value):
                return _shown(path)
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if _bad(key):
                    return _shown(where)
                children.append((where, item))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend(
                (f"{path}.{i}" if path else str(i), item)
                for i, item in reversed(list(enumerate(value)))
            )
    return None
