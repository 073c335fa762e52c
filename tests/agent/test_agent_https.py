"""The agent's API over HTTPS: a real agent process, the openai SDK, renewal without restart."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import httpx2
import openai
import pytest
from cryptography import x509

from agent.config import load_config
from agent.errors import ConfigError
from agent.https import server_cert_files
from coordinator.identity.ca import CertificateAuthority
from devtools.fleet import AgentProcess
from devtools.process import wait_until
from edgefleet.tls import CertFiles, write_atomically

TINY = "tiny-llama"


def _issue(ca: CertificateAuthority, files: CertFiles, agent_id: str) -> str:
    issued = ca.issue_client(agent_id, server_names=["127.0.0.1"])
    write_atomically(files.key, issued.key_pem, private=True)
    write_atomically(files.cert, issued.cert_pem)
    return issued.serial


def _presented_serial(port: int, ca_pem: str) -> str:
    context = ssl.create_default_context(cadata=ca_pem)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return format(x509.load_der_x509_certificate(der).serial_number, "x")


def _chat(base_url: str, **http: object) -> str:
    with openai.OpenAI(
        base_url=base_url + "/v1", api_key="unused", max_retries=0,
        http_client=httpx2.Client(**http),  # type: ignore[arg-type]
    ) as client:  # fmt: skip
        reply = client.chat.completions.create(
            model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    return str(reply.choices[0].message.content)


async def test_https_agent_process_verified_by_the_fleet_ca_and_renewed_live(
    tmp_path: Path, tiny_artifacts: Path
) -> None:
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(ca.cert_pem)
    files = CertFiles(tmp_path / "agent.crt", tmp_path / "agent.key")
    first = _issue(ca, files, "edge-tls")
    agent = AgentProcess(
        models_dir=str(tiny_artifacts), serve=[TINY], agent_id="edge-tls",
        extra_args=[
            "--tls", "on", "--threads", "1",
            "--set", f"server.tls_cert_file={files.cert}",
            "--set", f"server.tls_key_file={files.key}",
            "--set", f"coordinator.ca_file={ca_file}",
            "--set", "server.tls_reload_interval_s=0.2",
        ],
    )  # fmt: skip
    async with agent:
        assert agent.url.startswith("https://127.0.0.1:")
        port = int(agent.url.rsplit(":", 1)[1])
        # the openai SDK trusting the fleet CA is served
        text = await asyncio.to_thread(
            _chat, agent.url, verify=ssl.create_default_context(cafile=str(ca_file))
        )
        assert isinstance(text, str)
        # a client trusting only the system CAs fails verification
        with pytest.raises(openai.APIConnectionError) as failed:
            await asyncio.to_thread(_chat, agent.url)
        assert "CERTIFICATE_VERIFY_FAILED" in repr(failed.value.__cause__)
        # renewal: new files, no restart; the next connection presents the new certificate
        assert await asyncio.to_thread(_presented_serial, port, ca.cert_pem) == first
        renewed = _issue(ca, files, "edge-tls")
        assert renewed != first

        async def presents_renewed() -> bool:
            return await asyncio.to_thread(_presented_serial, port, ca.cert_pem) == renewed

        await wait_until(presents_renewed, timeout_s=15, message="the renewed certificate")
        assert await asyncio.to_thread(
            _chat, agent.url, verify=ssl.create_default_context(cafile=str(ca_file))
        )
        assert agent.returncode is None


def test_beyond_loopback_without_a_certificate_refuses_unless_opted_out(tmp_path: Path) -> None:
    state = {"coordinator": {"state_dir": str(tmp_path / "state")}}
    lan = load_config(environ={}, overrides={**state, "server": {"host": "0.0.0.0"}})
    with pytest.raises(ConfigError, match="--insecure-no-tls"):
        server_cert_files(lan)
    opted_out = load_config(
        environ={}, overrides={**state, "server": {"host": "0.0.0.0", "tls": "off"}}
    )
    assert server_cert_files(opted_out) is None
    # loopback stays plain HTTP by default (development)
    assert server_cert_files(load_config(environ={}, overrides=state)) is None
    with pytest.raises(ConfigError, match="no certificate"):
        server_cert_files(load_config(environ={}, overrides={**state, "server": {"tls": "on"}}))


def test_insecure_no_tls_flag_sets_tls_off() -> None:
    from agent.__main__ import build_parser, overrides_from_args

    args = build_parser().parse_args(["--insecure-no-tls"])
    assert overrides_from_args(args)["server.tls"] == "off"
