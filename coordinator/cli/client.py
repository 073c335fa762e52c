"""How every operator command reaches a running coordinator's admin API: one client.

The address is ``--url``, else the configured one (https when the configuration serves
HTTPS). The admin token comes from ``--admin-token-file`` or ``$EDGEFLEET_ADMIN_TOKEN``,
never from a flag (``/proc/PID/cmdline`` is readable by every user of the host).

Beyond loopback the coordinator serves HTTPS (``http_tls = auto``) with a certificate its
own fleet CA issued, unless the operator gave one (``http_tls_cert_file``). So every
command that talks to it (``keys``, ``tokens``, ``admin-tokens``, ``agents``, ``audit``,
``models``, ``rollouts``) trusts the system's CAs (an operator's certificate) and the fleet
CA: ``--ca-file``, by default the data directory's ``ca/ca.pem``. Once only the ``models``
commands did; the others trusted the system's CAs alone and could not reach a coordinator
serving its own certificate.

Requests and answers are JSON (urllib: no third-party HTTP client in the CLI). A failure
becomes :class:`AdminRequestError` with a message an operator can act on: ``METHOD PATH:
STATUS MESSAGE`` with the message from the OpenAI-style error body (else the HTTP reason),
or ``cannot reach the coordinator at URL: WHY``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, BinaryIO

from coordinator.config import CoordinatorConfig

ADMIN_TOKEN_ENV = "EDGEFLEET_ADMIN_TOKEN"
TIMEOUT_S = 10.0
#: 503 answers that say the action was not done because no coordinator led at that moment
#: (coordinator/api/rollouts.py: the leader died or changed while it was asked or
#: forwarded); a new leader is in place within the lease's time, so they are tried again,
#: after Retry-After, for this long. Any other failure is reported at once.
LEADERLESS_CODES = frozenset({"no_leader", "not_leader"})
LEADERLESS_RETRY_S = 30.0
_CHUNK = 1 << 20


class AdminRequestError(Exception):
    """A command failed: the admin API answered with an error or could not be reached, or
    the command's input was refused (the message says which)."""


def add_client_arguments(parser: argparse.ArgumentParser, *, url_help: str) -> None:
    """``--url``, ``--admin-token-file`` and ``--ca-file``."""
    parser.add_argument("--url", help=url_help)
    parser.add_argument(
        "--admin-token-file", type=Path, metavar="FILE",
        help=f"file holding the admin token (default: ${ADMIN_TOKEN_ENV})",
    )  # fmt: skip
    parser.add_argument(
        "--ca-file", type=Path, metavar="FILE",
        help="CA certificate for an https --url, trusted beside the system's (default: the "
        "data directory's ca/ca.pem)",
    )  # fmt: skip


def default_url(config: CoordinatorConfig) -> str:
    """The configured admin API address (https when the configuration serves HTTPS)."""
    scheme = "https" if config.http_tls_enabled else "http"
    return f"{scheme}://{config.http_host}:{config.http_port}"


def ca_file_of(args: argparse.Namespace, config: CoordinatorConfig) -> Path:
    """``--ca-file``, else the fleet CA in the configured data directory."""
    given: Path | None = getattr(args, "ca_file", None)
    return given if given is not None else config.data_path / "ca" / "ca.pem"


def admin_token(token_file: Path | None) -> str:
    """The first line of ``token_file``, else ``$EDGEFLEET_ADMIN_TOKEN`` (may be empty)."""
    if token_file is None:
        return os.environ.get(ADMIN_TOKEN_ENV, "")
    try:
        lines = token_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminRequestError(f"cannot read {token_file}: {exc}") from exc
    return lines[0].strip() if lines else ""


def client_context(url: str, ca_file: Path | None) -> ssl.SSLContext | None:
    """For an https ``url``: the system's CAs and ``ca_file`` when it exists (None for
    http)."""
    if not url.startswith("https://"):
        return None
    context = ssl.create_default_context()
    if ca_file is not None and ca_file.is_file():
        context.load_verify_locations(cafile=str(ca_file))
    return context


class AdminClient:
    """The admin API of one coordinator, as one operator (their token)."""

    def __init__(
        self, url: str, token: str, *, ca_file: Path | None = None, timeout: float = TIMEOUT_S
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.ca_file = ca_file
        self.timeout = timeout
        self._context: ssl.SSLContext | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, config: CoordinatorConfig) -> AdminClient:
        """``--url`` (else the configured address), the admin token and the CA file."""
        url = args.url or default_url(config)
        return cls(url, admin_token(args.admin_token_file), ca_file=ca_file_of(args, config))

    def with_timeout(self, timeout: float) -> AdminClient:
        return AdminClient(self.url, self.token, ca_file=self.ca_file, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, *, data: BinaryIO | None = None,
             length: int | None = None, timeout: float | None = None) -> Any:  # fmt: skip
        """Send ``body`` as JSON (or ``data``, ``length`` bytes, as a raw upload); the
        answer's JSON."""
        request = self._request(method, path, body=body, data=data, length=length)
        with self._open(request, path, timeout) as response:
            raw = self._read(response, method, path)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise AdminRequestError(f"{method} {path}: the answer is not JSON ({exc})") from exc

    def text(self, path: str) -> str:
        """GET ``path``; the answer as text (e.g. JSON lines)."""
        with self._open(self._request("GET", path), path, None) as response:
            return self._read(response, "GET", path).decode()

    def download(self, path: str, destination: Path) -> None:
        """GET ``path`` into the file ``destination``."""
        request = self._request("GET", path)
        with self._open(request, path, None) as response:
            try:
                with destination.open("wb") as out:
                    shutil.copyfileobj(response, out, _CHUNK)
            except OSError as exc:
                raise AdminRequestError(f"cannot download {path}: {exc}") from exc

    def _request(self, method: str, path: str, *, body: Any = None,
                 data: BinaryIO | None = None, length: int | None = None,
                 ) -> urllib.request.Request:  # fmt: skip
        headers = {"Accept": "application/json"}
        payload: Any = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            payload = data
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(length)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if not self.url.startswith(("http://", "https://")):
            raise AdminRequestError(
                f"not an admin API address: {self.url!r} (give http://HOST:PORT or https://...)"
            )
        return urllib.request.Request(self.url + path, data=payload, method=method,
                                      headers=headers)  # fmt: skip

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self._context is None and self.url.startswith("https://"):
            try:
                self._context = client_context(self.url, self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise AdminRequestError(f"cannot load the CA file {self.ca_file}: {exc}") from exc
        return self._context

    def _open(self, request: urllib.request.Request, path: str, timeout: float | None) -> Any:
        method = request.get_method()
        context = self._ssl_context()
        give_up = time.monotonic() + LEADERLESS_RETRY_S
        while True:
            try:
                return urllib.request.urlopen(
                    request, timeout=self.timeout if timeout is None else timeout, context=context
                )
            except urllib.error.HTTPError as exc:
                error = _error(exc)
                wait = _retry_after(exc)
                if (
                    exc.code == 503
                    and error.get("code") in LEADERLESS_CODES
                    and not hasattr(request.data, "read")  # an upload's stream is spent
                    and time.monotonic() + wait < give_up
                ):
                    print(f"{method} {path}: {error.get('message', exc.reason)} (trying again "
                          f"in {wait:g} s)", file=sys.stderr)  # fmt: skip
                    time.sleep(wait)
                    continue
                message = error.get("message") or str(exc.reason)
                raise AdminRequestError(f"{method} {path}: {exc.code} {message}") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise AdminRequestError(
                    f"cannot reach the coordinator at {self.url}: {exc}"
                ) from exc

    def _read(self, response: IO[bytes], method: str, path: str) -> bytes:
        try:
            return response.read()
        except OSError as exc:
            raise AdminRequestError(f"{method} {path}: the answer broke off: {exc}") from exc


def _error(exc: urllib.error.HTTPError) -> dict[str, Any]:
    """The OpenAI-style error body's ``error`` object (empty when there is none)."""
    try:
        error = json.load(exc)["error"]
    except (ValueError, KeyError, TypeError, OSError):
        return {}
    return error if isinstance(error, dict) else {}


def _retry_after(exc: urllib.error.HTTPError) -> float:
    """The answer's Retry-After in seconds (1 when absent or not a number; at most 5)."""
    try:
        return min(5.0, max(0.0, float(exc.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0
