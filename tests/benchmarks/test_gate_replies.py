"""benchmarks/gate_replies refuses a comparison of a build with itself (no agent started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import gate_replies


def test_the_same_build_twice_is_refused(tiny_artifacts: Path) -> None:
    with pytest.raises(SystemExit, match="nothing to compare"):
        directory = str(tiny_artifacts)
        gate_replies.main(
            ["--model", "tiny-llama", "--before-dir", directory, "--models-dir", directory]
        )
