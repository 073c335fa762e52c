"""sslyze, in a tool venv of its own: the TLS servers' profile checked as an auditor would.

sslyze cannot live in the project's venv (6.3.1 needs cryptography<47; the project pins
50), so it gets a venv under the machine's cache,
``${EDGEFLEET_CACHE_DIR:-~/.cache/edgefleet}/tools/sslyze-<key>``, the key made of the
pinned versions, the Python version and this file's content. It is built once, under a
lock (two pytest-xdist workers wait for one build), then used through its command line.

    python -m devtools.sslyze_tool HOST:PORT ...   # build if needed, scan, print the report
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What the tool venv installs. nassl is the OpenSSL that does the scanning.
PINS = ("sslyze==6.3.1", "nassl==5.4.0", "cryptography==46.0.7")
#: Tool venvs kept per machine (a new pin or a new version of this file makes a new one).
KEEP = 3

# "    127.0.0.1:8443: FAILED - Not compliant." then "        * ciphers: Cipher suites ..."
_VERDICT = re.compile(r"^\s{4}(?P<server>\S+): (?P<verdict>OK|FAILED|ERROR) - ")
_ISSUE = re.compile(r"^\s{8}\* (?P<criterion>\w+): (?P<text>.*)$")


class SslyzeError(Exception):
    """The tool venv cannot be built, or sslyze did not produce a report."""


def tools_dir() -> Path:
    cache = os.environ.get("EDGEFLEET_CACHE_DIR") or str(Path.home() / ".cache" / "edgefleet")
    return Path(cache).expanduser() / "tools"


def venv_key() -> str:
    """The pins, this interpreter's version and this file's content, hashed."""
    digest = hashlib.sha256()
    digest.update("\n".join(PINS).encode())
    digest.update(f"{sys.version_info[0]}.{sys.version_info[1]}".encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def _progress(message: str) -> None:
    print(f"sslyze-tool: {message}", file=sys.stderr, flush=True)


def sslyze_command() -> list[str]:
    """``[python, -m, sslyze]`` of the tool venv, built first if this machine has none."""
    root = tools_dir()
    venv = root / f"sslyze-{venv_key()}"
    command = [str(venv / "bin" / "python"), "-m", "sslyze"]
    if (venv / ".complete").exists():
        return command
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".sslyze.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait, then find it built
        if (venv / ".complete").exists():
            return command
        _progress(f"building the tool venv {venv} (once per machine): {' '.join(PINS)}")
        shutil.rmtree(venv, ignore_errors=True)  # a build that was cut short
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install",
                 "--quiet", "--disable-pip-version-check", *PINS],
                capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise SslyzeError(f"pip install {' '.join(PINS)} failed:\n{done.stderr[-4000:]}")
            check = subprocess.run([*command, "--help"], capture_output=True, timeout=60)
            if check.returncode != 0:
                raise SslyzeError(f"sslyze does not run: {check.stderr.decode()[-2000:]}")
            (venv / ".complete").touch()
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        _progress(f"built {venv}")
        old = sorted(root.glob("sslyze-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in [p for p in old if p != venv and (p / ".complete").exists()][KEEP - 1 :]:
            shutil.rmtree(stale, ignore_errors=True)
    return command


@dataclass(frozen=True, slots=True)
class ServerVerdict:
    """One server's line in sslyze's "Compliance against TLS configuration" section."""

    server: str  # as sslyze writes it: "127.0.0.1:8443"
    verdict: str  # "OK", "FAILED" (not compliant) or "ERROR" (the scan did not complete)
    issues: dict[str, str]  # criterion ("ciphers", "tls_curves", ...) -> sslyze's words


@dataclass(frozen=True, slots=True)
class Scan:
    verdicts: dict[str, ServerVerdict]  # by "host:port"
    results: dict[str, Any]  # sslyze's --json_out server_scan_results, by "host:port"
    output: str  # sslyze's stdout (the compliance section, with --quiet)


def parse_compliance(stdout: str) -> dict[str, ServerVerdict]:
    verdicts: dict[str, ServerVerdict] = {}
    current: ServerVerdict | None = None
    for line in stdout.splitlines():
        if verdict := _VERDICT.match(line):
            current = ServerVerdict(verdict["server"], verdict["verdict"], {})
            verdicts[current.server] = current
        elif (issue := _ISSUE.match(line)) and current is not None:
            current.issues[issue["criterion"]] = issue["text"]
    return verdicts


def scan(
    targets: list[str],
    json_out: Path,
    *,
    profile: str = "intermediate",
    client_cert: tuple[Path, Path] | None = None,
    timeout_s: float = 300.0,
) -> Scan:
    """Scan ``targets`` ("host:port") in one sslyze run, checked against Mozilla's
    ``profile``; ``client_cert`` (certificate, key) for servers that require one."""
    command = [*sslyze_command(), "--quiet", f"--json_out={json_out}",
               f"--mozilla_config={profile}"]  # fmt: skip
    if client_cert is not None:
        command += [f"--cert={client_cert[0]}", f"--key={client_cert[1]}"]
    done = subprocess.run(
        [*command, *targets], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if not json_out.is_file():
        raise SslyzeError(f"sslyze wrote no report (exit {done.returncode}):\n{done.stderr}")
    report = json.loads(json_out.read_text())
    results = {}
    for result in report["server_scan_results"]:
        location = result["server_location"]
        results[f"{location['hostname']}:{location['port']}"] = result
    return Scan(parse_compliance(done.stdout), results, done.stdout)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        found = scan(argv, Path(tmp) / "sslyze.json")
    print(found.output)
    return 0 if all(v.verdict == "OK" for v in found.verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
