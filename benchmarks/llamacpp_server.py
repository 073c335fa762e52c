"""llama.cpp's OpenAI-compatible server (llama-cpp-python) as a benchmark peer.

Its own virtual environment lives in ``~/.cache/edgefleet/llamacpp-venv`` (outside the
clone, so every clone and CI run on the machine shares it; ``$XDG_CACHE_HOME`` is honoured)
and is built once (compiling llama.cpp takes about 8 minutes on 2 cores), then reused.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from devtools.process import ServiceProcess

VERSION = "0.3.36"
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgefleet"
VENV = CACHE_ROOT / "llamacpp-venv"
PYTHON = VENV / "bin" / "python"
_READY = re.compile(r"Uvicorn running on http://")


def ensure_built() -> Path:
    """The venv's python, after building llama-cpp-python[server] when it is missing."""
    probe = [str(PYTHON), "-c", "import llama_cpp.server, llama_cpp; print(llama_cpp.__version__)"]
    if PYTHON.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return PYTHON
    print(f"building llama-cpp-python {VERSION} into {VENV} (about 8 minutes on 2 cores) ...",
          flush=True)  # fmt: skip
    VENV.parent.mkdir(parents=True, exist_ok=True)
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


class LlamaCppServer(ServiceProcess):
    """``python -m llama_cpp.server`` from the benchmark venv, ready once uvicorn listens.

    The model is loaded before uvicorn starts, so its "running on" line means it serves.
    """

    def __init__(self, gguf: Path, port: int, threads: int) -> None:
        self.gguf = gguf
        self.port = port
        self.threads = threads
        self.url = f"http://127.0.0.1:{port}"
        args = ["--model", str(gguf.resolve()),
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                "--n_threads", str(threads), "--n_threads_batch", str(threads),
                # with interruption on, a new request aborts the one being streamed
                "--interrupt_requests", "False"]  # fmt: skip
        super().__init__(
            "llama_cpp.server", args, _READY, startup_timeout_s=60.0, executable=PYTHON
        )

    async def start(self) -> None:
        # the first run builds the venv (minutes): keep the event loop free meanwhile
        await asyncio.to_thread(ensure_built)
        await super().start()
