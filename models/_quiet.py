"""Silence third-party warnings and chatter around conversion calls.

The test suite turns warnings into errors; conversion libraries (torch tracing, transformers,
optimum, onnxruntime.quantization) emit many harmless ones. They are silenced here, locally,
instead of weakening the pytest configuration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

__all__ = ["offline_env", "quiet"]

_NOISY_LOGGERS = (
    "transformers",
    "optimum",
    "onnxruntime",
    "torch.onnx",
    "accelerate",
)


def offline_env() -> None:
    """Forbid any model-hub access and silence hub/tokenizer chatter for this process."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Ignore warnings and lower third-party log levels inside the block."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    root = logging.getLogger()
    root_level = root.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        # onnxruntime.quantization logs through the root logger (logging.info); our own
        # "models" logger has its own level and keeps reporting.
        root.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, level in saved.items():
                logging.getLogger(name).setLevel(level)
            root.setLevel(root_level)
