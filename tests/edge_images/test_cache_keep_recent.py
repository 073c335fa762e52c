"""The image cache keeps only the most recently used entries of each kind: the bundle
tarball, edgefleet's wheel and the wheelhouse gain a key with every commit, and before
this a machine that ran CI on many commits filled its disk (300 MB a bundle)."""

from __future__ import annotations

import os
from pathlib import Path

from edge_images.cache import keep_recent

HEX16 = "[0-9a-f]" * 16


def _entry(root: Path, name: str, mtime: float, *, directory: bool = False) -> Path:
    path = root / name
    if directory:
        path.mkdir()
        (path / "x.whl").write_bytes(b"w")
    else:
        path.write_bytes(b"t")
    os.utime(path, (mtime, mtime))
    return path


def test_only_the_most_recently_used_stay_and_the_one_in_use_is_never_removed(
    tmp_path: Path,
) -> None:
    old = [_entry(tmp_path, f"edgefleet-bundle-{i:016x}.tar", 1000 + i) for i in range(6)]
    partial = _entry(tmp_path, "edgefleet-bundle-00000000000000ff.tar.partial", 10)
    other_kind = _entry(tmp_path, "rootfs-bookworm-0123456789abcdef.tar", 5)
    # the oldest is the one being used now: it becomes the most recent
    keep_recent(old[0], f"edgefleet-bundle-{HEX16}.tar", 3)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([old[0].name, old[5].name, old[4].name, partial.name, other_kind.name]), (
        left
    )


def test_an_amd64_pattern_leaves_other_architectures_alone(tmp_path: Path) -> None:
    amd = [
        _entry(tmp_path, f"wheelhouse-{i:016x}-{i:016x}", 2000 + i, directory=True)
        for i in range(4)
    ]
    arm = _entry(tmp_path, f"wheelhouse-arm64-{0:016x}-{0:016x}", 1, directory=True)
    keep_recent(amd[3], f"wheelhouse-{HEX16}-{HEX16}", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([amd[3].name, arm.name])
