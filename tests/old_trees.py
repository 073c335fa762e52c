"""Old source trees that tests run, vendored so that they need no git history.

A ``git clone --depth 1`` has no old commits to ``git archive``; the trees the tests run
(an old coordinator that writes a database for the migration tests, an old agent that
speaks the previous contract version) are kept here instead, as xz-compressed tar archives
of exactly what ``git archive COMMIT PATHS`` gives (its pax header names the commit), with
only the paths the tests need.

    python -m tests.old_trees     # rewrite the archives from git history (a full clone)
"""

from __future__ import annotations

import io
import lzma
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

ARCHIVES = Path(__file__).resolve().parent / "data" / "old_trees"
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class OldTree:
    commit: str  # abbreviated commit id, as in the archive's name
    paths: tuple[str, ...]  # what is taken from that commit's tree
    why: str

    @property
    def archive(self) -> Path:
        return ARCHIVES / f"{self.commit}.tar.xz"


# The coordinator package at the last commit before schema versions: it writes the
# database that tests/coordinator/test_store_migrations.py migrates.
COORDINATOR_BEFORE_VERSIONS = OldTree(
    "9bb823e",
    ("coordinator",),
    "the coordinator's store before schema versions (tests/coordinator/test_store_migrations.py)",
)
# The last agent that speaks contract v1.2 (before the model-sync messages), with the
# modules of models/ it imports and the .proto its generated code came from.
AGENT_CONTRACT_V1_2 = OldTree(
    "f15fd8a",
    (
        "agent",
        "edgefleet",
        "models/__init__.py",
        "models/_quiet.py",
        "models/errors.py",
        "models/export_llm.py",
        "models/llama_graph.py",
        "models/manifest.py",
        "protos/edgefleet/v1/fleet.proto",
    ),
    "an agent speaking contract v1.2 (tests/e2e/test_contract_compat.py)",
)
TREES = (COORDINATOR_BEFORE_VERSIONS, AGENT_CONTRACT_V1_2)


def extract(tree: OldTree, into: Path) -> Path:
    """Unpack ``tree`` under ``into`` (created if missing) and return ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tree.archive, "r:xz") as tar:
        tar.extractall(into, filter="data")
    return into


def write(tree: OldTree) -> Path:
    """Rewrite ``tree``'s archive from git history (needs the commit: not a shallow clone)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", tree.commit, "--", *tree.paths],
        capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if tar.pax_headers.get("comment", "") == "":
            raise RuntimeError(f"git archive {tree.commit}: no commit id in the pax header")
    ARCHIVES.mkdir(parents=True, exist_ok=True)
    tree.archive.write_bytes(lzma.compress(archive, preset=9 | lzma.PRESET_EXTREME))
    return tree.archive


def main() -> None:
    for tree in TREES:
        path = write(tree)
        print(f"{path.relative_to(REPO)}: {path.stat().st_size:,} bytes ({tree.why})")


if __name__ == "__main__":
    main()
