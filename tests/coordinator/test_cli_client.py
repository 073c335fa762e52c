"""The operator CLI's one admin API client (coordinator/cli/client.py): what an operator
reads when the admin API refuses a request, answers with something unexpected, or cannot be
reached; and that every command group goes through it (the same token, the same messages,
exit status 1)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from coordinator.__main__ import main as coordinator_main
from coordinator.cli import client
from coordinator.cli.client import ADMIN_TOKEN_ENV, AdminClient, AdminRequestError, admin_token


@dataclass
class Answer:
    status: int = 200
    body: bytes = b'{"object": "list", "data": []}'
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeAdminApi:
    url: str
    answer: Answer = field(default_factory=Answer)
    first: list[Answer] = field(default_factory=list)  # answered, in order, before ``answer``
    seen: list[tuple[str, str, str, bytes]] = field(default_factory=list)


@pytest.fixture
def api() -> Iterator[FakeAdminApi]:
    state = FakeAdminApi(url="")

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            auth = self.headers.get("Authorization", "")
            state.seen.append((self.command, self.path, auth, body))
            answer = state.first.pop(0) if state.first else state.answer
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _refused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


UNAUTHORIZED = json.dumps(
    {"error": {"message": "admin token required", "type": "auth", "code": "unauthorized"}}
).encode()


def test_the_error_bodys_message_is_shown(api: FakeAdminApi) -> None:
    api.answer = Answer(401, UNAUTHORIZED)
    with pytest.raises(AdminRequestError) as raised:
        AdminClient(api.url, "").call("GET", "/v1/admin/keys")
    assert str(raised.value) == "GET /v1/admin/keys: 401 admin token required"


def test_an_error_body_not_in_the_api_format_shows_the_http_reason(api: FakeAdminApi) -> None:
    api.answer = Answer(502, b"<html>bad gateway</html>", "text/html")
    with pytest.raises(AdminRequestError) as raised:
        AdminClient(api.url, "t").call("POST", "/v1/admin/tokens", {"max_uses": 1})
    assert str(raised.value) == "POST /v1/admin/tokens: 502 Bad Gateway"


def test_an_answer_that_is_not_json_is_an_error(api: FakeAdminApi) -> None:
    api.answer = Answer(200, b"<html>a proxy's login page</html>", "text/html")
    with pytest.raises(AdminRequestError, match=r"GET /v1/admin/keys: the answer is not JSON"):
        AdminClient(api.url, "t").call("GET", "/v1/admin/keys")


def _leaderless(code: str) -> Answer:
    body = {"error": {"message": f"({code}) try again.", "type": "server_error", "code": code}}
    return Answer(503, json.dumps(body).encode(), headers={"Retry-After": "0"})


def test_an_action_asked_while_no_coordinator_leads_is_tried_again(
    api: FakeAdminApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """503 no_leader / not_leader: nothing was done (the leader was changing), so the CLI
    asks again after Retry-After, as an operator would have to."""
    api.first = [_leaderless("no_leader"), _leaderless("not_leader")]
    api.answer = Answer(201, b'{"rollout_id": "ro-1"}')
    got = AdminClient(api.url, "t").call("POST", "/v1/admin/rollouts", {"model": "m"})
    assert got == {"rollout_id": "ro-1"}
    assert [seen[3] for seen in api.seen] == [b'{"model": "m"}'] * 3  # the same body each time
    assert capsys.readouterr().err.count("trying again in 0 s") == 2


def test_a_leader_that_did_not_answer_is_not_asked_again(api: FakeAdminApi) -> None:
    """503 leader_unreachable: the leader may have done it, so it is reported, not retried."""
    api.answer = _leaderless("leader_unreachable")
    with pytest.raises(AdminRequestError, match=r"503 \(leader_unreachable\) try again"):
        AdminClient(api.url, "t").call("POST", "/v1/admin/rollouts", {"model": "m"})
    assert len(api.seen) == 1


def test_retrying_a_leaderless_fleet_gives_up(
    api: FakeAdminApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "LEADERLESS_RETRY_S", 0.3)
    api.answer = _leaderless("no_leader")
    api.answer.headers["Retry-After"] = "0.1"
    with pytest.raises(AdminRequestError, match=r"POST /v1/admin/rollouts: 503 \(no_leader\)"):
        AdminClient(api.url, "t").call("POST", "/v1/admin/rollouts", {"model": "m"})
    assert 2 <= len(api.seen) <= 4


def test_connection_refused_names_the_address() -> None:
    url = _refused_url()
    with pytest.raises(AdminRequestError) as raised:
        AdminClient(url + "/", "t").call("GET", "/v1/admin/keys")
    assert str(raised.value).startswith(f"cannot reach the coordinator at {url}: ")
    assert "refused" in str(raised.value).lower()


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "localhost", "ftp://host"])
def test_a_url_not_http_is_an_error_not_a_traceback(url: str) -> None:
    with pytest.raises(AdminRequestError, match=rf"not an admin API address: '{url}'"):
        AdminClient(url, "t").call("GET", "/v1/admin/keys")


def test_json_in_and_out_with_the_token(api: FakeAdminApi) -> None:
    api.answer = Answer(201, b'{"token_id": "jt-1"}')
    got = AdminClient(api.url + "/", "s3cret").call("POST", "/v1/admin/tokens", {"site": "a"})
    assert got == {"token_id": "jt-1"}
    assert api.seen == [("POST", "/v1/admin/tokens", "Bearer s3cret", b'{"site": "a"}')]


def test_the_token_comes_from_the_file_else_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "from-env")
    assert admin_token(None) == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\nignored\n")
    assert admin_token(token_file) == "from-file"
    with pytest.raises(AdminRequestError, match=r"cannot read .*missing"):
        admin_token(tmp_path / "missing")


GROUPS = [
    ("tokens", "list"),
    ("keys", "list"),
    ("admin-tokens", "list"),
    ("audit", "export"),
    ("agents", "drain", "edge-1"),
    ("models", "list"),
    ("rollouts", "list"),
]


@pytest.mark.parametrize("command", GROUPS, ids=lambda c: " ".join(c))
def test_every_command_group_uses_the_one_client(
    command: tuple[str, ...],
    api: FakeAdminApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "the-token")
    monkeypatch.chdir(tmp_path)  # no coordinator.toml of anyone's
    api.answer = Answer(401, UNAUTHORIZED)
    data_dir = [] if command[0] == "rollouts" else ["--data-dir", str(tmp_path)]
    assert coordinator_main([*command, "--url", api.url, *data_dir]) == 1
    (method, path, auth, _), *_ = api.seen
    assert auth == "Bearer the-token"
    err = capsys.readouterr().err
    assert err == f"edgefleet-coordinator: error: {method} {path}: 401 admin token required\n"

    monkeypatch.delenv(ADMIN_TOKEN_ENV)
    url = _refused_url()
    assert coordinator_main([*command, "--url", url, *data_dir]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"edgefleet-coordinator: error: cannot reach the coordinator at {url}: ")
