"""``python -m edge_images build agent-cpu|agent-cuda|coordinator [--arch amd64|arm64]``,
``... check-arch --arch arm64``, ``... check-cuda`` and ``... bundle``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from edge_images.arch import ARCHES, DEFAULT_ARCH
from edge_images.errors import ImageBuildError
from edge_images.images import DEFAULT_MODELS, DEFAULT_SERVE, TARGETS, build_image


def _models(value: str) -> Path | None:
    return None if value == "none" else Path(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_images", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build an image (cached) and export its archives")
    b.add_argument("target", choices=TARGETS)
    b.add_argument("--models", type=_models, default=DEFAULT_MODELS,
                   help="model set to bake in: a signed set (`coordinator models export`), "
                   "artifact directories (signed at build time), or 'none' (the image starts "
                   "empty and syncs)")  # fmt: skip
    b.add_argument("--serve", action="append", help="artifact names (default: the shipped two)")
    b.add_argument("--no-export", action="store_true", help="build only, no archives")
    a = sub.add_parser(
        "check-arch",
        help="build the agent-cpu image for --arch (cached), then check its architecture "
        "and ONNX Runtime inside it and get one chat completion (emulated when foreign)",
    )
    a.add_argument("--models", type=_models, default=DEFAULT_MODELS)
    a.add_argument("--serve", action="append")
    a.add_argument("--no-chat", action="store_true", help="skip starting the agent")
    for command in (b, a):
        # not argparse choices: the builder's own error names the architectures it knows
        command.add_argument("--arch", default=DEFAULT_ARCH,
                             help=f"Debian architecture: {', '.join(ARCHES)} (default "
                             f"{DEFAULT_ARCH}; a foreign one builds under qemu-user)")  # fmt: skip
    k = sub.add_parser(
        "check-cuda", help="build the CUDA image (cached), then check its CUDA provider"
    )
    k.add_argument("--models", type=_models, default=DEFAULT_MODELS)
    k.add_argument("--serve", action="append")
    c = sub.add_parser("bundle", help="the offline bundle tarball")
    c.add_argument("--models", type=_models, default=DEFAULT_MODELS)
    c.add_argument("--serve", action="append")
    c.add_argument("--out", type=Path, default=None, help="copy the bundle here")
    for command in (b, a, k, c):
        command.add_argument(
            "--signing-key", type=Path, default=None, metavar="PEM",
            help="ed25519 key (PEM, made if absent) that signs artifact directories; "
            "default: one kept in the build cache",
        )  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    serve = tuple(args.serve or DEFAULT_SERVE)
    try:
        if args.command == "build":
            built = build_image(args.target, models=args.models, serve=serve,
                                export=not args.no_export, signing_key=args.signing_key,
                                arch=args.arch)  # fmt: skip
            print(json.dumps({
                "image": built.ref, "arch": args.arch, "size_bytes": built.size_bytes,
                "oci_archive": str(built.oci_archive) if not args.no_export else None,
                "docker_archive": str(built.docker_archive) if not args.no_export else None,
                "labels": built.labels, "built_s": built.steps_s,
            }, indent=2))  # fmt: skip
        elif args.command == "check-arch":
            from edge_images.archcheck import check_arch_image

            built = build_image("agent-cpu", models=args.models, serve=serve,
                                signing_key=args.signing_key, arch=args.arch)  # fmt: skip
            # the build's figures first: a failed check does not lose them
            print(json.dumps({"image": built.ref, "arch": args.arch,
                              "size_bytes": built.size_bytes,
                              "oci_archive_bytes": built.oci_archive.stat().st_size,
                              "built_s": built.steps_s}, indent=2), flush=True)  # fmt: skip
            checked = check_arch_image(built, args.arch, chat=not args.no_chat)
            print(json.dumps(checked, indent=2))
            return 0 if checked["ok"] else 1
        elif args.command == "check-cuda":
            from edge_images.images import check_cuda

            built = build_image(
                "agent-cuda", models=args.models, serve=serve, signing_key=args.signing_key
            )
            checked = check_cuda(built.ref)
            print(json.dumps({"image": built.ref, "size_bytes": built.size_bytes,
                              "oci_archive_bytes": built.oci_archive.stat().st_size,
                              **checked}, indent=2))  # fmt: skip
            return 0 if checked["ok"] else 1
        else:
            from edge_images.bundle import build_bundle

            bundle = build_bundle(models=args.models, serve=serve, signing_key=args.signing_key)
            out = bundle.path
            if args.out:
                import shutil

                shutil.copy2(bundle.path, args.out)
                out = args.out
            print(json.dumps({"bundle": str(out), "size_bytes": bundle.size_bytes}, indent=2))
    except ImageBuildError as exc:
        print(f"edge_images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
