"""Model sync on the agent: apply the coordinator's ModelsSection, hot-swap, report.

For every target in a ModelsSection (one background task per model name; a newer target
for the same name replaces a task still downloading):

1. the manifest is checked: its sha256 is the one named, its signature verifies with a
   trusted key (``agent.sync.trust``), it parses, and its name and version are the ones
   named; nothing is fetched or loaded otherwise;
2. the files the store lacks are fetched (``agent.sync.fetch``): site peers first, then
   the coordinator, each file's sha256 checked before it enters the store;
3. the version loads beside the one serving, when free memory allows
   (``models.load_memory_factor`` x its bytes, else a reported refusal); the on-box
   self-check runs (``agent.sync.self_check``; once per version and process: a version
   swapped back in, as in a rollback, is not checked again);
4. it is swapped in: new requests go to it, the old version's running requests finish,
   then it is closed. ``active.json`` names it for a cold start.

Any failure (download, hash, signature, load, memory, self-check) leaves the old version
serving and the target FAILED with its reason in the inventory. The section's generation
is acknowledged once every target in it is LOADED or FAILED. Names a section does not
mention keep serving what they serve.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.engine.embedder import OnnxEmbeddingModel
from agent.engine.interface import EmbeddingModel, TextModel
from agent.engine.residency import ModelState as ResidencyState
from agent.errors import (
    AgentError,
    InsufficientMemoryError,
    ManifestTrustError,
    ModelSyncError,
    SelfCheckFailedError,
)
from agent.model_registry import ModelRegistry
from agent.sync.fetch import BlobFetcher, BlobSource, SourceKind
from agent.sync.self_check import run_self_check
from agent.sync.store import ModelStore, parse_manifest
from agent.sync.trust import TrustedKeys
from edgefleet.contract import (
    ModelInventory,
    ModelInventoryState,
    ModelsSection,
    ModelTarget,
    Residency,
    SelfCheckResult,
)
from edgefleet.model_signing import check_name
from models.manifest import ModelManifest, verify_files

log = logging.getLogger(__name__)

Model = TextModel | EmbeddingModel
#: Builds a model (not started) from an artifact directory; blocking, run in a thread.
LoadModel = Callable[[Path, ModelManifest], Model]
State = ModelInventoryState
# Runtime check for "is an embedding model" (the Protocols are not runtime-checkable).
EmbeddingModelTypes = (OnnxEmbeddingModel,)


def free_memory_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class SyncOptions:
    self_check: bool = True  # run the on-box accuracy check before swapping in
    self_check_threads: int = 1
    self_check_prompts: int = 8  # of the gate's 20 factual prompts
    load_memory_factor: float = 1.5  # free memory needed: this x the version's bytes
    drain_timeout_s: float = 600.0  # old version closed after this even if still busy
    own_blob_url: str = ""  # this agent's blob base URL (never fetched from)
    verify_on_cold_start: bool = True
    # False: a distribution-only node (a site cache, the benchmark's sync-only clients):
    # versions are fetched, verified and served to peers, never loaded; ON_DISK is done.
    load: bool = True


@dataclass
class _Entry:
    name: str
    version: str
    state: State = State.DOWNLOADING
    bytes_done: int = 0
    bytes_total: int = 0
    last_error: str = ""
    self_check: SelfCheckResult | None = None
    from_peers: int = 0
    from_coordinator: int = 0
    started: float = field(default_factory=time.monotonic)

    def report(self) -> ModelInventory:
        return ModelInventory(
            name=self.name,
            version=self.version,
            state=self.state,
            bytes_done=self.bytes_done,
            bytes_total=self.bytes_total,
            last_error=self.last_error[:500],
            self_check=self.self_check,
            bytes_from_peers=self.from_peers,
            bytes_from_coordinator=self.from_coordinator,
        )


class ModelSync:
    def __init__(
        self,
        store: ModelStore,
        fetcher: BlobFetcher,
        trust: TrustedKeys,
        registry: ModelRegistry,
        load_model: LoadModel,
        options: SyncOptions | None = None,
        *,
        on_dead: Callable[[str], None] | None = None,
        on_progress: Callable[[ModelInventory], None] | None = None,
    ) -> None:
        self.store = store
        self.fetcher = fetcher
        self.trust = trust
        self.registry = registry
        self._load_model = load_model
        self.options = options or SyncOptions()
        self._on_dead = on_dead
        self._on_progress = on_progress
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._tasks: dict[str, tuple[ModelTarget, asyncio.Task[None]]] = {}
        self._drains: set[asyncio.Task[None]] = set()
        self._load_lock = asyncio.Lock()
        self._section: ModelsSection | None = None
        #: Self-checks passed in this process, by (name, version, manifest sha256): a
        #: version swapped back in (a rollback) loads without checking the same files on
        #: the same runtime again, so the bad version it replaces serves seconds, not the
        #: minutes a check takes on a busy box.
        self._passed_checks: dict[tuple[str, str, str], SelfCheckResult] = {}
        #: The ModelsSection generation whose every target is loaded or failed.
        self.applied_generation = 0
        self.swaps = 0

    # ------------------------------------------------------------- inventory

    def set_on_dead(self, on_dead: Callable[[str], None] | None) -> None:
        """Who hears that a swapped-in engine failed past its restart policy."""
        self._on_dead = on_dead

    def inventory(self) -> tuple[ModelInventory, ...]:
        """Every version this agent holds, fetches, loads or serves."""
        found: dict[tuple[str, str], ModelInventory] = {}
        for stored in self.store.versions():
            if stored.installed_ns:
                found[(stored.name, stored.version)] = ModelInventory(
                    stored.name, stored.version, State.ON_DISK
                )
        for key, entry in self._entries.items():
            report = entry.report()
            if report.state is State.LOADED and self._current_version(entry.name) != entry.version:
                report = report._replace(state=State.ON_DISK)  # swapped out since
            found[key] = report
        registry = self.registry
        models: list[Model] = [*registry.text_models.values(), *registry.embedding_models.values()]
        residency = registry.residency
        for model in models:
            key = (model.model_id, model.version)
            prior = found.get(key)
            found[key] = (
                prior._replace(state=State.LOADED, last_error="")
                if prior is not None
                else ModelInventory(model.model_id, model.version, State.LOADED)
            )
            # served here; in memory now, or loaded by its next request (0)
            resident = None if residency is None else residency.resident_bytes(model.model_id)
            if resident is not None:
                found[key] = found[key]._replace(resident_bytes=resident)
        return tuple(found[k] for k in sorted(found))

    def entry(self, name: str, version: str) -> ModelInventory | None:
        e = self._entries.get((name, version))
        return None if e is None else e.report()

    # ------------------------------------------------------------------ apply

    def apply(self, section: ModelsSection) -> None:
        """Start (or keep) a task per target; returns at once (called from the session)."""
        self._section = section
        for target in section.models:
            running = self._tasks.get(target.name)
            if running is not None:
                old_target, task = running
                same = (old_target.version, old_target.sha256) == (target.version, target.sha256)
                store_only = target.residency is Residency.STORE_ONLY
                if same and store_only == (old_target.residency is Residency.STORE_ONLY):
                    if not task.done():
                        self._tasks[target.name] = (target, task)  # newer peers, same work
                        continue
                    entry = self._entries.get((target.name, target.version))
                    done = State.ON_DISK if store_only else State.LOADED
                    if entry is not None and entry.state is done:
                        self._tasks[target.name] = (target, task)
                        self._hold(target)  # on demand <-> pinned: no new install
                        continue
                task.cancel()
            previous = running[1] if running is not None else None
            # a fresh entry now: the section is not applied until this attempt ends
            self._entries[(target.name, target.version)] = _Entry(target.name, target.version)
            new = asyncio.create_task(
                self._install(target, previous), name=f"model-sync-{target.name}"
            )
            self._tasks[target.name] = (target, new)
        self._update_applied()

    def _update_applied(self) -> None:
        section = self._section
        if section is None:
            return
        for target in section.models:
            store_only = target.residency is Residency.STORE_ONLY
            if not store_only and self._current_version(target.name) == target.version:
                continue
            entry = self._entries.get((target.name, target.version))
            done = State.LOADED if self.options.load and not store_only else State.ON_DISK
            if entry is None or entry.state not in (done, State.FAILED):
                return
        self.applied_generation = max(self.applied_generation, section.generation)

    def _current_version(self, name: str) -> str | None:
        model = self.registry.text_models.get(name) or self.registry.embedding_models.get(name)
        return None if model is None else model.version

    async def wait_applied(self, generation: int, timeout_s: float) -> None:
        """For tests and tools: until ``generation`` is applied (TimeoutError)."""
        async with asyncio.timeout(timeout_s):
            while self.applied_generation < generation:
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        tasks = [t for _, t in self._tasks.values()] + list(self._drains)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self.fetcher.close()

    # ---------------------------------------------------------------- install

    async def _install(self, target: ModelTarget, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        key = (target.name, target.version)
        entry = self._entries.get(key) or _Entry(target.name, target.version)
        self._entries[key] = entry
        try:
            manifest = self._checked_manifest(target)
            store_only = target.residency is Residency.STORE_ONLY
            if not store_only and self._current_version(target.name) == target.version:
                entry.state = State.LOADED
                self._hold(target)
                return
            self.store.put_manifest(target.name, target.version, target.manifest, target.signature)
            await self._download(entry, manifest, target)
            self.store.mark_installed(target.name, target.version)
            entry.state = State.ON_DISK
            self._progress(entry)
            if store_only:
                self._withdraw(target.name)
            elif self.options.load:
                await self._activate(entry, manifest, target.manifest)
                self._hold(target)
        except asyncio.CancelledError:
            if entry.state not in (State.LOADED, State.FAILED):
                entry.state = State.FAILED
                entry.last_error = "replaced by a newer target before it finished"
            raise
        except ModelSyncError as exc:
            self._fail(entry, exc.message)
        except AgentError as exc:  # a load failure (ModelLoadError) is not fatal here
            self._fail(entry, exc.message)
        except Exception as exc:
            log.exception("model sync of %s@%s failed", target.name, target.version)
            self._fail(entry, f"{type(exc).__name__}: {exc}")
        finally:
            self._update_applied()
            self._progress(entry)

    def _hold(self, target: ModelTarget) -> None:
        """How the served ``target`` holds its weights: pinned (loaded now if it is not,
        never unloaded for room or idleness) or on demand. Models outside the residency
        (embeddings; an agent without a budget) are always loaded."""
        residency = self.registry.residency
        if residency is None or residency.state(target.name) is None:
            return
        pinned = target.residency is Residency.PINNED
        residency.set_pinned(target.name, "target", pinned)
        if pinned and residency.state(target.name) is not ResidencyState.LOADED:
            task = asyncio.create_task(self._load_pinned(target.name), name="pin-" + target.name)
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    async def _load_pinned(self, name: str) -> None:
        residency = self.registry.residency
        try:
            if residency is not None and residency.state(name) is not None:
                await residency.load(name, "pinned")
        except AgentError as exc:  # no room now: its next request loads it, and it stays
            log.warning("pinned model %s not loaded now: %s", name, exc.message)

    def _withdraw(self, name: str) -> None:
        """The target says store only: stop serving ``name`` (its running requests finish),
        and start without it next time."""
        old = self.registry.withdraw(name)
        self.store.set_active(name, None)
        if old is None:
            return
        log.info("%s@%s: kept on disk, no longer served (residency store_only)", name,
                 old.version)  # fmt: skip
        task = asyncio.create_task(self._drain(old), name=f"drain-{name}")
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    def _fail(self, entry: _Entry, reason: str) -> None:
        entry.state = State.FAILED
        entry.last_error = reason
        log.error("model %s@%s failed: %s (the serving version keeps serving)",
                  entry.name, entry.version, reason)  # fmt: skip

    def _progress(self, entry: _Entry) -> None:
        if self._on_progress is not None:
            try:
                self._on_progress(entry.report())
            except Exception:
                log.exception("progress callback failed")

    def _checked_manifest(self, target: ModelTarget) -> ModelManifest:
        try:
            check_name("model name", target.name)
            check_name("version", target.version)
        except ValueError as exc:
            raise ManifestTrustError(str(exc)) from exc
        digest = hashlib.sha256(target.manifest).hexdigest()
        if digest != target.sha256:
            raise ManifestTrustError(
                f"the manifest's sha256 {digest[:12]} is not the {target.sha256[:12]} named"
            )
        self.trust.check(target.manifest, target.signature)
        manifest = parse_manifest(target.manifest)
        if (manifest.name, manifest.version) != (target.name, target.version):
            raise ManifestTrustError(
                f"the manifest is {manifest.name}@{manifest.version}, not the "
                f"{target.name}@{target.version} named"
            )
        return manifest

    def _sources(self, target: ModelTarget) -> list[BlobSource]:
        own = self.options.own_blob_url.rstrip("/")
        peers = [
            BlobSource(url, "peer")
            for url in dict.fromkeys(target.peer_urls)
            if url and url.rstrip("/") != own
        ]
        if target.artifact_url:
            peers.append(BlobSource(target.artifact_url, "coordinator"))
        return peers

    async def _download(self, entry: _Entry, manifest: ModelManifest, target: ModelTarget) -> None:
        unique = {e.sha256: e.size for e in manifest.files}
        entry.bytes_total = sum(unique.values())
        missing = self.store.missing(manifest)
        entry.bytes_done = entry.bytes_total - sum(size for _, size in missing)
        for sha, _ in missing:  # a .part from an earlier attempt is resumed, not redone
            part = self.store.partial(sha)
            if part.exists():
                entry.bytes_done += part.stat().st_size
        if not missing:
            return
        entry.state = State.DOWNLOADING
        sources = self._sources(target)
        last_report = [0.0]

        def progress(n: int, kind: SourceKind) -> None:
            entry.bytes_done += n
            if kind == "peer":
                entry.from_peers += n
            else:
                entry.from_coordinator += n
            now = time.monotonic()
            if now - last_report[0] >= 0.5:
                last_report[0] = now
                self._progress(entry)

        # the site's first agent (lowest blob URL) fetches from the coordinator; the others
        # wait for their peers to have the blob, so one copy per site crosses the WAN
        own = self.options.own_blob_url.rstrip("/")
        peer_urls = [s.base_url.rstrip("/") for s in sources if s.kind == "peer"]
        follower = bool(own and peer_urls and min(peer_urls) < own)
        results = await asyncio.gather(
            *(
                self.fetcher.fetch(sha, size, sources, progress, wait_for_peers=follower)
                for sha, size in missing
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if isinstance(result, ModelSyncError):
                    raise result
                raise ModelSyncError(f"download failed: {result}") from result
        entry.bytes_done = entry.bytes_total

    # ---------------------------------------------------------------- activate

    async def _activate(self, entry: _Entry, manifest: ModelManifest, raw: bytes) -> None:
        async with self._load_lock:
            need = int(sum(e.size for e in manifest.files) * self.options.load_memory_factor)
            residency = self.registry.residency
            if residency is not None:  # the new copy beside the serving one, in the budget
                try:
                    residency.reserve_for(need)
                except AgentError as exc:
                    raise InsufficientMemoryError(
                        f"not enough free memory to load {entry.name}@{entry.version} beside "
                        f"the serving version (residency.budget_bytes): {exc.message}"
                    ) from exc
            free = free_memory_bytes()
            if free and need > free:
                raise InsufficientMemoryError(
                    f"not enough free memory to load {entry.name}@{entry.version} beside the "
                    f"serving version: needs about {need >> 20} MiB "
                    f"(models.load_memory_factor x its files), {free >> 20} MiB available"
                )
            entry.state = State.LOADING
            self._progress(entry)
            view = self.store.view(entry.name, entry.version, raw)
            model = await asyncio.to_thread(self._load_model, view, manifest)
            try:
                await model.start(self._dead_callback(entry.name))
                checked = (entry.name, entry.version, hashlib.sha256(raw).hexdigest())
                passed_before = self._passed_checks.get(checked)
                if self.options.self_check and passed_before is not None:
                    entry.self_check = passed_before
                    log.info("self-check of %s@%s passed on this box before (%.1f s): "
                             "not run again", entry.name, entry.version,
                             passed_before.seconds)  # fmt: skip
                elif self.options.self_check:
                    entry.state = State.CHECKING
                    self._progress(entry)
                    result = await asyncio.to_thread(
                        run_self_check,
                        view,
                        manifest,
                        self.options.self_check_threads,
                        self.options.self_check_prompts,
                    )
                    entry.self_check = result
                    if result.passed:
                        self._passed_checks[checked] = result
                    log.info("self-check of %s@%s: %s in %.1f s (perplexity %.3f, x%.3f of fp32,"
                             " %d/%d answers)", entry.name, entry.version,
                             "passed" if result.passed else "FAILED", result.seconds,
                             result.perplexity, result.perplexity_ratio, result.greedy_matched,
                             result.greedy_total)  # fmt: skip
                    if not result.passed:
                        raise SelfCheckFailedError(f"self-check failed: {result.detail}")
            except BaseException:
                await model.close()
                raise
            self._swap_in(model)
        entry.state = State.LOADED
        entry.last_error = ""
        self._update_applied()  # in the same step: no report sees it loaded but unacked
        self.store.set_active(entry.name, entry.version)
        keep = {(t.name, t.version) for t in (self._section.models if self._section else ())}
        await asyncio.to_thread(self.store.prune, keep)

    def _dead_callback(self, name: str) -> Callable[[str], None] | None:
        on_dead = self._on_dead
        if on_dead is None:
            return None
        return lambda reason: on_dead(f"model {name}: {reason}")

    def _swap_in(self, model: Model) -> None:
        old: Model | None
        if isinstance(model, EmbeddingModelTypes):
            old = self.registry.swap_embedding(model)
        else:
            old = self.registry.swap_text(model)  # type: ignore[arg-type]
        self.swaps += 1
        log.info("now serving %s@%s%s", model.model_id, model.version,
                 f" (was {old.version}; it finishes its requests)" if old else "")  # fmt: skip
        if old is not None and old is not model:
            task = asyncio.create_task(self._drain(old), name=f"drain-{old.model_id}")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)

    async def _drain(self, old: Model) -> None:
        """Close ``old`` once its running and queued requests are done (idle for 0.5 s:
        a request that looked it up just before the swap has submitted by then)."""
        deadline = time.monotonic() + self.options.drain_timeout_s
        idle_since: float | None = None
        while time.monotonic() < deadline:
            busy = 0
            if not isinstance(old, EmbeddingModelTypes):
                load = old.load()  # type: ignore[union-attr]
                busy = load.running + load.waiting
            now = time.monotonic()
            if busy:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= 0.5:
                break
            await asyncio.sleep(0.05)
        await old.close()
        log.info("unloaded %s@%s", old.model_id, old.version)

    # --------------------------------------------------------------- cold start

    async def cold_start(self) -> list[str]:
        """Load the versions ``active.json`` names (signatures checked, files verified) into
        the registry before serving; a version that fails is skipped with an error."""
        loaded: list[str] = []
        for name, version in sorted(self.store.active().items()):
            stored = self.store.get(name, version)
            try:
                if stored is None or not stored.installed_ns:
                    raise ModelSyncError("not installed in the store")
                self.trust.check(stored.manifest, stored.signature)
                manifest = parse_manifest(stored.manifest)
                if (manifest.name, manifest.version) != (name, version):
                    raise ManifestTrustError("the stored manifest names another version")
                view = self.store.view(name, version, stored.manifest)
                if self.options.verify_on_cold_start:
                    await asyncio.to_thread(verify_files, manifest, view)
                model = await asyncio.to_thread(self._load_model, view, manifest)
            except Exception as exc:
                log.error("cold start: cannot load %s@%s from the store: %s", name, version, exc)
                self._entries[(name, version)] = _Entry(
                    name, version, State.FAILED, last_error=f"cold start: {exc}"
                )
                continue
            if isinstance(model, EmbeddingModelTypes):
                self.registry.embedding_models[name] = model
            else:
                self.registry.swap_text(model)  # type: ignore[arg-type]
            loaded.append(f"{name}@{version}")
        return loaded
