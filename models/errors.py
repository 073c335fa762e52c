"""Exceptions raised by the ``models`` package.

One root, so callers can catch everything from this package at once::

    ModelsError
    ├── ManifestError          manifest.json is missing, unreadable or does not match the schema
    │   └── IntegrityError     a file listed in the manifest is missing or its size/sha256 differ
    ├── SourceError            a weight package or the file inside it cannot be found
    └── ConversionError        export, quantization or evaluation of a model failed

``ManifestError`` and ``IntegrityError`` are what a serving process meets: the artifact on disk
is unusable and must be rebuilt or re-fetched. ``SourceError`` and ``ConversionError`` only come
from the build tool. Library errors are converted at the boundary with ``raise ... from exc``.

This module imports only the standard library (the agent imports it).
"""

from __future__ import annotations

__all__ = [
    "ConversionError",
    "IntegrityError",
    "ManifestError",
    "ModelsError",
    "SourceError",
]


class ModelsError(Exception):
    """Root of every error raised by the ``models`` package."""


class ManifestError(ModelsError):
    """A manifest.json is missing, is not valid JSON, or does not follow the schema."""


class IntegrityError(ManifestError):
    """A file listed in a manifest is missing, or its size or sha256 differs."""


class SourceError(ModelsError):
    """A source package (weights, tokenizer) is not installed or lacks the expected file."""


class ConversionError(ModelsError):
    """Exporting, quantizing or evaluating a model failed."""
