"""A real browser for the dashboard's tests and benchmark: Playwright driving Debian's
Chromium (``apt-get install chromium``; Playwright's own browser download cannot work
offline), and axe-core from npm, installed once under ~/.cache/edgefleet for audits."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devtools.fleet import CoordinatorProcess

CACHE = Path(os.environ.get("EDGEFLEET_CACHE_DIR") or Path.home() / ".cache" / "edgefleet")
AXE_DIR = CACHE / "npm-axe"
AXE_VERSION = "4.14.1"


def chromium_path() -> str:
    """Debian's Chromium; a clear error when it is not installed."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("Chromium is not installed: apt-get install -y chromium")


def trusting_certificate(cert_pem: bytes) -> list[str]:
    """Chromium flags that trust the HTTPS server certificate ``cert_pem`` (a coordinator's,
    issued by its private fleet CA), as a browser into which the operator imported the CA
    would: its public key pinned (``--ignore-certificate-errors-spki-list``; the server
    sends no CA in its chain, so the CA's own key cannot be pinned). Any other certificate
    still fails."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert_pem).public_key()
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = base64.b64encode(hashlib.sha256(der).digest()).decode("ascii")
    return [f"--ignore-certificate-errors-spki-list={digest}"]


def axe_script() -> Path:
    """axe.min.js from npm's axe-core, installed under the cache on first use."""
    path = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
    if not path.is_file():
        AXE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", f"axe-core@{AXE_VERSION}"],
            cwd=AXE_DIR, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    return path


async def sign_in(page: Any, base_url: str, token: str) -> None:
    """Open the dashboard and sign in with ``token`` through its form."""
    await page.goto(f"{base_url}/dashboard/")
    await page.wait_for_selector("#view-signin:not([hidden])")
    await page.fill("#signin-token", token)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector("#view-fleet:not([hidden])")


@contextlib.asynccontextmanager
async def signed_in_page(
    coordinator: CoordinatorProcess, width: int = 1300, height: int = 900
) -> AsyncIterator[Any]:
    """A headless Chromium page that trusts ``coordinator``'s HTTPS certificate (made with
    ``tls=True``), on its dashboard, signed in with its admin token; closed after."""
    from playwright.async_api import async_playwright

    trust = trusting_certificate((coordinator.data_dir / "tls" / "http.crt").read_bytes())
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium_path(), headless=True,
                                          args=trust)  # fmt: skip
        try:
            context = await browser.new_context(viewport={"width": width, "height": height})
            page = await context.new_page()
            await sign_in(page, coordinator.http_url, coordinator.admin_token)
            yield page
        finally:
            await browser.close()


async def first_render_ms(page: Any) -> float:
    """Navigation start to the dashboard's ``edgefleet-first-render`` mark (painted)."""
    entries = "performance.getEntriesByName('edgefleet-first-render')"
    await poll(page, f"{entries}.length > 0")
    return float(await page.evaluate(f"{entries}[0].startTime"))


async def mark_ms(page: Any, name: str) -> float:
    """Navigation start to the page's performance mark ``name`` (waits for it)."""
    entries = f"performance.getEntriesByName({name!r})"
    await poll(page, f"{entries}.length > 0")
    return float(await page.evaluate(f"{entries}[0].startTime"))


async def poll(page: Any, expression: str, timeout_s: float = 30.0) -> Any:
    """Evaluate ``expression`` until it is truthy (page.wait_for_function evaluates
    strings with eval, which the dashboard's CSP refuses, as it should)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await page.evaluate(expression)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {expression}")
        await asyncio.sleep(0.05)


async def serious_accessibility_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now (id, impact,
    nodes). axe is evaluated over the DevTools protocol: the dashboard's CSP refuses a
    script tag from anywhere but its own origin."""
    await page.evaluate(axe_script().read_text())
    result = await page.evaluate(
        "axe.run().then(r => r.violations.map(v =>"
        " ({id: v.id, impact: v.impact, nodes: v.nodes.length})))"
    )
    return [v for v in result if v["impact"] in ("serious", "critical")]
