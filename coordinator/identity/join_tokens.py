"""Join tokens: what an operator hands to an edge box so it can enroll.

A token reads ``eft_<id>.<secret>``. The store keeps the id and the sha256 of the
secret; the whole token is shown once, when it is created.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol
from urllib.parse import urlsplit

from coordinator.errors import (
    TokenExhaustedError,
    TokenExpiredError,
    TokenRevokedError,
    UnknownTokenError,
    UnknownTokenRefError,
)
from coordinator.fleet.registry import utc_now
from coordinator.store.agents import AgentTable
from coordinator.store.join_tokens import JoinToken, JoinTokenTable
from edgefleet.contract import Location

logger = logging.getLogger(__name__)

PREFIX = "eft_"
_TOKEN = re.compile(r"^eft_(?P<id>[0-9a-f]{12})\.(?P<secret>[A-Za-z0-9_-]{20,128})$")

Clock = Callable[[], datetime]


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewToken:
    """A token just created: the full token string is only available here."""

    token: str = field(repr=False)
    record: JoinToken


def parse_token(token: str) -> tuple[str, str]:
    """Split a token into (token id, secret); raises UnknownTokenError when malformed."""
    match = _TOKEN.match(token.strip())
    if match is None:
        raise UnknownTokenError("the join token is malformed (expected eft_<id>.<secret>)")
    return match["id"], match["secret"]


class TokenStore(JoinTokenTable, AgentTable, Protocol):
    """What JoinTokens needs of the store."""


class JoinTokens:
    """Create, list, revoke and check join tokens in the store."""

    def __init__(self, store: TokenStore, *, clock: Clock | None = None) -> None:
        self._store = store
        self._clock = clock or utc_now

    async def create(
        self,
        *,
        expires_in: timedelta | None = timedelta(hours=24),
        max_uses: int = 1,
        site: str = "",
        note: str = "",
        location: Location | None = None,
        http_url: str = "",
    ) -> NewToken:
        """A new token; ``site``, ``location`` and ``http_url`` are fixed for the agents
        that enroll with it (a URL only makes sense with ``max_uses=1``)."""
        if max_uses < 1:
            raise ValueError(f"max_uses must be at least 1, got {max_uses}")
        if expires_in is not None and expires_in <= timedelta(0):
            raise ValueError("expires_in must be positive")
        if http_url and max_uses != 1:
            raise ValueError("a join token that fixes http_url must allow exactly one use")
        if http_url:
            check_http_url(http_url)
        now = self._clock()
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(24)
        record = JoinToken(
            token_id=token_id,
            secret_sha256=sha256_hex(secret),
            created_at=now,
            expires_at=None if expires_in is None else now + expires_in,
            max_uses=max_uses,
            site=site,
            note=note,
            location=location,
            http_url=http_url,
        )
        await self._store.add_token(record)
        logger.info(
            "join token %s created (uses %d, site %r, expires %s)",
            token_id,
            max_uses,
            site or "-",
            record.expires_at.isoformat() if record.expires_at else "never",
        )
        return NewToken(token=f"{PREFIX}{token_id}.{secret}", record=record)

    async def list(self) -> list[JoinToken]:
        return await self._store.list_tokens()

    async def revoke(self, token_id: str) -> None:
        """Stop new enrollments with the token. Agents already enrolled with it stay
        (``tokens revoke --agents`` revokes them too, through ``agents_of``)."""
        if not await self._store.revoke_token(token_id):
            raise UnknownTokenRefError(token_id)
        logger.info("join token %s revoked", token_id)

    async def agents_of(self, token_id: str) -> builtins.list[str]:
        """Ids of the agents enrolled with this token."""
        return await self._store.agents_of_token(token_id)

    async def check(self, token: str) -> JoinToken:
        """The token's record when it can be used now; raises an EnrollmentError saying why not."""
        return self.explain(await self.verify(token))

    async def verify(self, token: str) -> JoinToken:
        """The token's record when its secret is right, whatever its state."""
        token_id, secret = parse_token(token)
        record = await self._store.get_token(token_id)
        if record is None or not hmac.compare_digest(record.secret_sha256, sha256_hex(secret)):
            raise UnknownTokenError(f"join token {token_id} is not known to this coordinator")
        return record

    def explain(self, record: JoinToken) -> JoinToken:
        state = record.state(self._clock())
        if state == "revoked":
            raise TokenRevokedError(f"join token {record.token_id} was revoked")
        if state == "expired":
            expiry = record.expires_at.isoformat() if record.expires_at else "?"
            raise TokenExpiredError(f"join token {record.token_id} expired at {expiry}")
        if state == "exhausted":
            raise TokenExhaustedError(
                f"join token {record.token_id} was already used {record.uses} of "
                f"{record.max_uses} time(s)"
            )
        return record


def check_http_url(url: str) -> str:
    """``url`` when it is an absolute http(s) URL with a host; raises ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an absolute http(s) URL")
    return url
