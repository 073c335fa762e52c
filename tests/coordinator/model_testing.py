"""Small artifact directories for catalog tests: the real tiny-llama build manifest with
its files replaced by small ones (the coordinator stores and signs files, it never loads
them), so a test can publish several versions in milliseconds."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from edgefleet import contract_pb
from edgefleet.contract import (
    LoadReport,
    ModelInventory,
    ModelInventoryState,
    ModelsSection,
    ModelStats,
)
from edgefleet.v1 import fleet_pb2 as pb
from tests.conftest import ARTIFACTS
from tests.coordinator.coordinator_testing import hello

REPO_ROOT = Path(__file__).resolve().parents[2]
# built by the tiny_artifacts fixture: a test that calls make_artifact uses it
TINY_MANIFEST = ARTIFACTS / "tiny-llama" / "manifest.json"


def make_artifact(
    directory: Path,
    *,
    weights: bytes,
    tokenizer: bytes = b'{"tokenizer": "shared"}',
    gate_passed: bool | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Write an artifact directory; returns its manifest. ``weights`` decides the
    version (as the models build names it: variant + 12 hex of the graph's sha256)."""
    manifest = json.loads(TINY_MANIFEST.read_text(encoding="utf-8"))
    directory.mkdir(parents=True, exist_ok=True)
    contents = {"config.json": b'{"config": 1}', "model.onnx": weights, "tokenizer.json": tokenizer}
    files = []
    for path, data in contents.items():
        (directory / path).write_bytes(data)
        files.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    manifest["files"] = files
    graph_sha = hashlib.sha256(weights).hexdigest()
    manifest["version"] = version or f"{manifest['variant']}-{graph_sha[:12]}"
    if gate_passed is not None:
        manifest["accuracy"] = {
            "perplexity": 22.7 if not gate_passed else 13.1,
            "perplexity_ratio": 1.75 if not gate_passed else 1.01,
            "perplexity_ratio_max": 1.15,
            "factual_correct": 8 if not gate_passed else 18,
            "factual_total": 20,
            "passed": gate_passed,
        }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    written: dict[str, Any] = manifest
    return written


class RawAgent:
    """An agent's Session over the real gRPC stub: sends Hello and reports, keeps what
    the coordinator pushes (Welcome, the models section)."""

    def __init__(self, stub: Any, agent_id: str, **fields: Any) -> None:
        self.agent_id = agent_id
        self._outbox: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
        self._outbox.put_nowait(hello(agent_id, **fields))
        self.welcome: pb.Welcome | None = None
        self.models: ModelsSection | None = None
        self.pushes = 0
        self._call = stub.Session(self._messages())
        self._reader = asyncio.create_task(self._read())

    async def _messages(self) -> AsyncIterator[pb.AgentMessage]:
        while (message := await self._outbox.get()) is not None:
            yield message

    async def _read(self) -> None:
        async for message in self._call:
            kind = message.WhichOneof("body")
            if kind == "welcome":
                self.welcome = message.welcome
            elif kind == "desired_state":
                state = contract_pb.desired_state_from_pb(message.desired_state)
                if state.models is not None:
                    self.models = state.models
                    self.pushes += 1

    def report(self, *inventory: ModelInventory, stats: tuple[ModelStats, ...] = ()) -> None:
        report = LoadReport(inventory=inventory, model_stats=stats)
        self._outbox.put_nowait(pb.AgentMessage(load_report=contract_pb.load_report_to_pb(report)))

    def versions(self) -> dict[str, str]:
        return {} if self.models is None else {t.name: t.version for t in self.models.models}

    async def close(self) -> None:
        self._outbox.put_nowait(None)
        self._call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def inventory(name: str, version: str, state: ModelInventoryState) -> ModelInventory:
    return ModelInventory(name=name, version=version, state=state)
