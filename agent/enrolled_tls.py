"""Client TLS contexts made from the files enrollment keeps, made again when they change.

An agent that serves plain HTTP (on loopback, or ``server.tls = off``) enrolls in its first
session, after it started: only then do its certificate, its key and the fleet CA appear
in ``coordinator.state_dir``, and renewals rewrite them later. What calls the fleet's HTTPS
servers with them (the blob fetcher: the coordinator's blob server and peers' stores;
overflow forwards to peers) asks for the context as each connection starts
(:class:`EnrolledClientContext`): made from the files as they are then, and again once any
of them changed. A context made once at start-up stayed None for such an agent, so it
could fetch no model from a coordinator serving HTTPS until it was restarted.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: Per watched file: (inode, size, mtime in ns), or None while it is absent.
_Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(paths: Sequence[Path]) -> _Stamp:
    found: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


class EnrolledClientContext:
    """``context()``: the client context ``make()`` returns for the ``watched`` files as
    they are now (None while it returns None: not enrolled yet), made again only when one
    of them changed (a few ``stat`` calls per connection otherwise)."""

    def __init__(self, make: Callable[[], ssl.SSLContext | None], watched: Sequence[Path]) -> None:
        self._make = make
        self._watched = tuple(watched)
        self._stamp: _Stamp | None = None
        self._context: ssl.SSLContext | None = None

    def __call__(self) -> ssl.SSLContext | None:
        stamp = _stamp(self._watched)
        if stamp != self._stamp:
            try:
                self._context = self._make()
            except (OSError, ssl.SSLError, ValueError) as exc:
                # e.g. a key written, its certificate not yet: the next change remakes it
                logger.warning("cannot use the enrollment certificate files yet: %s", exc)
                self._context = None
            self._stamp = stamp
        return self._context
