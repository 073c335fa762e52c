"""Errors of the image builder: one root, :class:`ImageBuildError`."""

from __future__ import annotations


class ImageBuildError(Exception):
    """A build step failed (the message names the step and the tool's own words)."""
