"""Durations on the command line: ``90s``, ``15m``, ``24h``, ``7d`` or ``never``."""

from __future__ import annotations

import argparse
from datetime import timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta | None:
    """``90s``, ``15m``, ``24h``, ``7d`` or ``never`` (None); a bare number is seconds."""
    text = text.strip().lower()
    if text == "never":
        return None
    unit = text[-1:]
    try:
        amount = float(text[:-1]) if unit in _UNITS else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 24h)") from None
    seconds = amount * _UNITS.get(unit, 1)
    if seconds <= 0:
        raise argparse.ArgumentTypeError("the duration must be positive")
    return timedelta(seconds=seconds)
