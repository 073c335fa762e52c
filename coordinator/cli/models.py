"""``python -m coordinator models publish|list|show|deprecate|delete|export|deploy``.

Every command talks to the running coordinator's admin API (``--url``, default from the
config's http_host/http_port) with the admin token from ``$EDGEFLEET_ADMIN_TOKEN`` (or
``--admin-token-file``): publish and delete and deploy need an operator token, the rest a
viewer. ``publish DIR`` checks the artifact's files against its manifest here, asks the
coordinator which blobs it lacks, uploads only those (the coordinator verifies each
sha256 before keeping it), then registers the manifest, which the coordinator signs.
``export --out DIR`` writes a signed model set (``edgefleet.model_signing`` layout) for
images and air-gapped sites, every blob checked against its sha256.

Over https with the coordinator's own CA, the CA certificate is read from
``<data_dir>/ca/ca.pem`` (or ``--ca-file``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from coordinator.catalog.catalog import CatalogVersion, parse_manifest, write_signed_set
from coordinator.catalog.replication import PUBLISH_WAIT_S
from coordinator.cli.client import AdminClient, AdminRequestError
from coordinator.config import CoordinatorConfig
from coordinator.errors import ModelCatalogError
from edgefleet.contract import Residency
from edgefleet.model_signing import MANIFEST_FILE, decode_public_key

_CHUNK = 1 << 20
TIMEOUT_S = 60.0  # per request; an upload gets 300 s


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    models = sub.add_parser(
        "models", help="publish, list, show, deprecate, delete, export or deploy model versions"
    )
    actions = models.add_subparsers(dest="action", required=True)
    leaves = []
    publish = actions.add_parser("publish", help="publish a built artifact directory")
    publish.add_argument("directory", type=Path, metavar="DIR")
    publish.add_argument("--name", help="catalog name (default: the manifest's)")
    publish.add_argument("--version", help="catalog version (default: the manifest's)")
    leaves.append(publish)
    listing = actions.add_parser("list", help="list published versions")
    listing.add_argument("--name", help="only this model")
    leaves.append(listing)
    for action, text in (
        ("show", "one version: files, agents desiring and loading it"),
        ("deprecate", "mark a version deprecated (--undo to clear)"),
        ("delete", "delete a version (refused while an agent desires or loads it)"),
    ):
        command = actions.add_parser(action, help=text)
        command.add_argument("ref", metavar="NAME@VERSION")
        if action == "deprecate":
            command.add_argument("--undo", action="store_true", help="clear the mark")
        leaves.append(command)
    export = actions.add_parser("export", help="write a signed model set into DIR")
    export.add_argument("--out", type=Path, required=True, metavar="DIR")
    export.add_argument(
        "refs", nargs="*", metavar="NAME@VERSION",
        help="versions to export (default: every version not deprecated)",
    )  # fmt: skip
    leaves.append(export)
    deploy = actions.add_parser(
        "deploy", help="every matching agent (default: the whole fleet) runs NAME@VERSION"
    )
    deploy.add_argument("ref", metavar="NAME@VERSION")
    deploy.add_argument("--site", action="append", default=[], dest="sites")
    deploy.add_argument("--label", action="append", default=[], dest="labels",
                        metavar="KEY=VALUE")  # fmt: skip
    deploy.add_argument("--agent", action="append", default=[], dest="agent_ids",
                        metavar="AGENT_ID")  # fmt: skip
    deploy.add_argument(
        "--residency", choices=[str(r) for r in Residency],
        help="how the agents hold the weights: on_demand (loaded by the first request, "
        "unloaded when idle), pinned (loaded once verified, never unloaded) or store_only "
        "(kept on disk, not served); default: as the rule this one replaces, else on_demand",
    )  # fmt: skip
    leaves.append(deploy)
    return leaves  # --ca-file, --url and the rest: cli/admin.py adds them to every command


def split_ref(ref: str) -> tuple[str, str]:
    name, at, version = ref.partition("@")
    if not at or not name or not version:
        raise AdminRequestError(f"{ref!r} is not NAME@VERSION")
    return name, version


def run(args: argparse.Namespace, config: CoordinatorConfig, client: AdminClient) -> int:
    _print(args, _run(args, client.with_timeout(TIMEOUT_S)))
    return 0


def _run(args: argparse.Namespace, client: AdminClient) -> Any:
    action = args.action
    if action == "publish":
        return publish(client, args.directory, name=args.name, version=args.version)
    if action == "list":
        query = f"?name={args.name}" if args.name else ""
        return client.call("GET", f"/v1/admin/models{query}")
    if action == "export":
        return export(client, args.out, args.refs)
    if action == "deploy":
        name, version = split_ref(args.ref)
        body = {"sites": args.sites, "labels": args.labels, "agent_ids": args.agent_ids}
        if args.residency:
            body["residency"] = args.residency
        return client.call("POST", f"/v1/admin/models/{name}/{version}/deploy", body)
    name, version = split_ref(args.ref)
    path = f"/v1/admin/models/{name}/{version}"
    if action == "show":
        return client.call("GET", path)
    if action == "deprecate":
        return client.call("POST", f"{path}/deprecate", {"deprecated": not args.undo})
    return client.call("DELETE", path)


def publish(client: AdminClient, directory: Path, *, name: str | None, version: str | None) -> Any:
    try:
        manifest = (directory / MANIFEST_FILE).read_bytes()
        _, data = parse_manifest(manifest, name=name, version=version)
    except OSError as exc:
        raise AdminRequestError(f"cannot read {directory / MANIFEST_FILE}: {exc}") from exc
    except ModelCatalogError as exc:
        raise AdminRequestError(f"{directory}: {exc}") from exc
    files = data["files"]
    _say(f"checking {len(files)} files of {directory} against the manifest ...")
    for entry in files:
        path = directory / entry["path"]
        try:
            got = _sha256(path)
        except OSError as exc:
            raise AdminRequestError(f"cannot read {path}: {exc}") from exc
        if got != entry["sha256"]:
            raise AdminRequestError(
                f"{path} does not match the manifest (sha256 {got}, manifest "
                f"{entry['sha256']}): rebuild the artifact"
            )
    wanted = sorted({e["sha256"] for e in files})
    missing = set(client.call("POST", "/v1/admin/model-blobs/missing", {"sha256": wanted})
                  ["missing"])  # fmt: skip
    uploaded = 0
    for entry in files:
        if entry["sha256"] not in missing:
            continue
        missing.discard(entry["sha256"])
        size = int(entry["size"])
        _say(f"uploading {entry['path']} ({size / 1e6:.1f} MB) ...")
        with (directory / entry["path"]).open("rb") as handle:
            client.call("PUT", f"/v1/admin/model-blobs/sha256/{entry['sha256']}",
                        data=handle, length=size, timeout=300)  # fmt: skip
        uploaded += size
    body = {"manifest_b64": base64.b64encode(manifest).decode("ascii")}
    if name:
        body["name"] = name
    if version:
        body["version"] = version
    # The coordinator answers once a second live coordinator holds the files too (or after
    # PUBLISH_WAIT_S: coordinator/catalog/replication.py).
    result = client.call("POST", "/v1/admin/models", body, timeout=PUBLISH_WAIT_S + 30.0)
    for warning in result.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    result["uploaded_bytes"] = uploaded
    result["files"] = len(files)
    return result


def export(client: AdminClient, out: Path, refs: list[str]) -> Any:
    listing = client.call("GET", "/v1/admin/models")
    public_key = decode_public_key(listing["signing_public_key"])
    if refs:
        chosen = [split_ref(r) for r in refs]
    else:
        chosen = [(v["name"], v["version"]) for v in listing["data"] if not v["deprecated"]]
    versions = []
    for name, version in chosen:
        shown = client.call("GET", f"/v1/admin/models/{name}/{version}")
        versions.append(
            CatalogVersion(
                name=shown["name"],
                version=shown["version"],
                task=shown["task"],
                manifest=base64.b64decode(shown["manifest_b64"]),
                signature=base64.b64decode(shown["signature_b64"]),
                sha256=shown["sha256"],
                size_bytes=shown["size_bytes"],
                gate_passed=shown["gate_passed"],
                deprecated=shown["deprecated"],
                published_at=datetime.fromisoformat(shown["published_at"].replace("Z", "+00:00")),
            )
        )

    def fetch(sha256: str, destination: Path) -> None:
        _say(f"fetching blob {sha256[:12]} ...")
        client.download(f"/v1/blobs/sha256/{sha256}", destination)

    try:
        return write_signed_set(out, versions, public_key, fetch)
    except ModelCatalogError as exc:
        raise AdminRequestError(str(exc)) from exc


def _print(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        print(json.dumps(result, indent=2))
        return
    action = args.action
    if action == "list":
        print(f"{'MODEL@VERSION':<48}{'SIZE MB':>9}  {'GATE':<6}{'DEPR':<6}{'DESIRED':>8}"
              f"{'LOADED':>8}{'HELD':>6}  PUBLISHED")  # fmt: skip
        for v in result["data"]:
            print(f"{v['ref']:<48}{v['size_bytes'] / 1e6:>9.1f}  "
                  f"{'ok' if v['gate_passed'] else 'FAIL':<6}{'yes' if v['deprecated'] else '-':<6}"
                  f"{v['desired_by']:>8}{v['loaded_on']:>8}{v.get('held_by', '-'):>6}  "
                  f"{v['published_at']}")  # fmt: skip
    elif action == "publish":
        state = "published" if result["created"] else "already published"
        gate = "gate passed" if result["gate_passed"] else "gate FAILED"
        print(f"{result['ref']} {state} (manifest sha256 {result['sha256'][:12]}, "
              f"{result['files']} files, {result['uploaded_bytes'] / 1e6:.1f} MB uploaded, "
              f"{gate})")  # fmt: skip
        if "held_by" in result:
            print(f"  files held by {result['held_by']} coordinator(s) "
                  f"({result['held_by_wanted']} wanted)")  # fmt: skip
    elif action == "export":
        print(f"exported {', '.join(result['versions']) or 'nothing'} to {result['root']} "
              f"({result['blobs_written']} blobs written)")  # fmt: skip
    elif action == "deploy":
        print(f"{result['name']}@{result['version']}: {result['agents_matching']} agent(s) "
              f"match; {len(result['agents_updated'])} updated now")  # fmt: skip
    elif action == "delete":
        print(f"{result['name']}@{result['version']} deleted ({result['blobs_removed']} blobs "
              "removed)")  # fmt: skip
    else:
        print(json.dumps(result, indent=2))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
