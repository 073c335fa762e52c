"""llama.cpp's OpenAI-compatible server (llama-cpp-python) as a benchmark peer.

Its own virtual environment lives in ``.benchcache/llamacpp-venv`` and is built once
(compiling llama.cpp takes about 8 minutes on 2 cores), then reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import aiohttp

from devtools.process import REPO_ROOT

VERSION = "0.3.36"
VENV = REPO_ROOT / ".benchcache" / "llamacpp-venv"
PYTHON = VENV / "bin" / "python"


def ensure_built() -> Path:
    """The venv's python, after building llama-cpp-python[server] when it is missing."""
    probe = [str(PYTHON), "-c", "import llama_cpp.server, llama_cpp; print(llama_cpp.__version__)"]
    if PYTHON.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return PYTHON
    print(f"building llama-cpp-python {VERSION} into {VENV} (about 8 minutes on 2 cores) ...",
          flush=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    started = time.monotonic()
    with subprocess.Popen(
        [str(PYTHON), "-m", "pip", "install", "--progress-bar", "off",
         f"llama-cpp-python[server]=={VERSION}"],
        env={"CMAKE_ARGS": "-DLLAVA_BUILD=OFF", "PATH": "/usr/local/bin:/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as pip:  # fmt: skip
        assert pip.stdout is not None
        for line in pip.stdout:
            print(f"  [{time.monotonic() - started:5.0f} s] {line.rstrip()}", flush=True)
    if pip.returncode != 0:
        raise RuntimeError("building llama-cpp-python failed (see the lines above)")
    return PYTHON


class LlamaCppServer:
    def __init__(self, gguf: Path, port: int, threads: int) -> None:
        self.gguf = gguf
        self.port = port
        self.threads = threads
        self.url = f"http://127.0.0.1:{port}"
        self._process: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> LlamaCppServer:
        python = ensure_built()
        self._process = subprocess.Popen(
            [str(python), "-m", "llama_cpp.server", "--model", str(self.gguf),
             "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048",
             "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads),
             # with interruption on, a new request aborts the one being streamed
             "--interrupt_requests", "False"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise RuntimeError(f"llama.cpp server exited with {self._process.returncode}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(self.url + "/v1/models") as resp:
                        if resp.status == 200:
                            return self
                await asyncio.sleep(0.2)
        raise RuntimeError("llama.cpp server did not come up in 60 s")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
