"""llama.cpp's OpenAI-compatible server (llama-cpp-python) as a benchmark peer.

It runs from a venv built for this machine's CPU (``benchmarks.llamacpp_build``: portable,
``GGML_NATIVE=OFF`` with the instruction sets the OS enables; built once per kind of CPU
into ``~/.cache/edgefleet/llamacpp/<key>/``, which takes about 5-8 minutes on 2 cores).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from benchmarks.llamacpp_build import describe, ensure_built
from devtools.process import ServiceProcess

_READY = re.compile(r"Uvicorn running on http://")


class LlamaCppServer(ServiceProcess):
    """``python -m llama_cpp.server`` from the benchmark venv, ready once uvicorn listens.

    The model is loaded before uvicorn starts, so its "running on" line means it serves.
    ``build`` is the venv's build info (``build-info.json``) once started.
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
        super().__init__("llama_cpp.server", args, _READY, startup_timeout_s=60.0)
        self.build: dict[str, Any] = {}

    async def start(self) -> None:
        # the first run builds the venv (minutes): keep the event loop free meanwhile
        python, self.build = await asyncio.to_thread(ensure_built)
        self.executable = str(python)
        print(f"llama.cpp peer: {describe(self.build)}", flush=True)
        await super().start()
