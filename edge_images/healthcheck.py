"""The images' health probe (Docker-format HEALTHCHECK; for OCI runtimes, run it with
``podman healthcheck run`` or as a Kubernetes exec probe): GET /healthz on the local port,
HTTPS first (an enrolled agent beyond loopback serves TLS), then plain HTTP. Exit 0 when
the service answers 200, 1 otherwise. The probe checks liveness on loopback only, so it
does not verify the certificate (it was issued for the agent's public name)."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request


def probe(port: int, timeout_s: float = 3.0) -> bool:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    for scheme in ("https", "http"):
        url = f"{scheme}://127.0.0.1:{port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s, context=insecure) as reply:
                return bool(reply.status == 200)
        except urllib.error.HTTPError:
            return False
        except (urllib.error.URLError, OSError):
            continue
    return False


def main() -> int:
    port = int(
        os.environ.get("EDGEFLEET_HEALTHCHECK_PORT")
        or os.environ.get("EDGEFLEET_AGENT_SERVER__PORT")
        or "8000"
    )
    return 0 if probe(port) else 1


if __name__ == "__main__":
    sys.exit(main())
