"""The moderation heads each embedding-model version brought, and the classifier for the
version served now.

The heads travel inside the embedding model's artifact (``<artifact>/moderation/``, listed
in its manifest: ``models/build_moderation.attach_heads``), so a version that model sync
fetches from the coordinator brings them; the old layout beside the models
(``<models.dir>/moderation/<name>``) is read at start as well. :meth:`ModerationShelf.add`
runs where a version loads (a worker thread: start, cold start from the store, model
sync); :meth:`ModerationShelf.current` runs per request and picks the heads of the version
the registry serves now, so a hot swap changes the classifier with the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from agent.errors import AgentError
from agent.model_registry import ModelRegistry
from agent.moderation.classifier import ModerationClassifier, ModerationHeads, heads_dir_for
from models.errors import ModelsError
from models.manifest import MANIFEST_FILENAME, ModelManifest, load_manifest
from models.moderation_spec import BUNDLED_HEADS_DIR

__all__ = ["ClassifierSource", "ModerationShelf", "fixed_classifier"]

log = logging.getLogger(__name__)

#: the classifier to use now, or None and why not
ClassifierSource = Callable[[], tuple[ModerationClassifier | None, str]]


def fixed_classifier(
    classifier: ModerationClassifier | None, why_not: str = ""
) -> ClassifierSource:
    """A source that always gives ``classifier`` (tests, tools)."""
    reason = why_not or "no moderation classifier is loaded"
    return lambda: (classifier, "" if classifier is not None else reason)


class ModerationShelf:
    """Heads by (embedding model, version); :meth:`current` is a :data:`ClassifierSource`."""

    def __init__(self, registry: ModelRegistry, *, verify: bool = True) -> None:
        self._registry = registry
        self._verify = verify
        # (model, version) -> its classifier, or why its heads are unusable
        self._found: dict[tuple[str, str], ModerationClassifier | str] = {}

    def add(self, directory: Path, manifest: ModelManifest) -> None:
        """Load the heads bundled in the artifact ``directory`` of ``manifest`` (blocking:
        call it where the model loads). An artifact without heads adds nothing."""
        if manifest.task != "feature-extraction":
            return
        if f"{BUNDLED_HEADS_DIR}/{MANIFEST_FILENAME}" not in {e.path for e in manifest.files}:
            log.info("%s@%s brought no moderation heads", manifest.name, manifest.version)
            return
        # bundled: they score the version they came with, whatever the catalog named it
        self._load(directory / BUNDLED_HEADS_DIR, manifest.name, manifest.version, bound=True)

    def add_from_dir(self, models_dir: Path) -> None:
        """At start, for each served embedding model not loaded through :meth:`add`: the
        heads bundled in its artifact under ``models_dir`` (when that is the served
        version), else those under ``models_dir/moderation/<name>`` (the layout before
        heads were bundled). Blocking."""
        for name, model in sorted(self._registry.embedding_models.items()):
            if (name, model.version) in self._found:
                continue
            try:
                manifest = load_manifest(models_dir / name)
            except ModelsError:
                manifest = None
            if manifest is not None and manifest.version == model.version:
                self.add(models_dir / name, manifest)
            beside = heads_dir_for(models_dir, name)
            if (name, model.version) not in self._found and (beside / MANIFEST_FILENAME).is_file():
                self._load(beside, name, model.version, bound=False)

    def _load(self, directory: Path, name: str, version: str, *, bound: bool) -> None:
        for key in [k for k in self._found if k[0] == name and k[1] != version]:
            served = self._registry.embedding_models.get(name)
            if served is None or served.version != key[1]:
                del self._found[key]  # a version no longer served
        try:
            heads = ModerationHeads(directory, verify=self._verify)
        except AgentError as exc:
            log.error("moderation heads for %s@%s unusable: %s", name, version, exc.message)
            self._found[(name, version)] = exc.message
            return
        except Exception as exc:  # the model serves on without them: never fail its load
            why = f"the heads in {directory} are unusable: {type(exc).__name__}: {exc}"
            log.error("moderation heads for %s@%s unusable: %s", name, version, why)
            self._found[(name, version)] = why
            return
        if heads.embedding_model != name:
            why = f"the heads in {directory} are for {heads.embedding_model}, not {name}"
            log.error("moderation heads for %s@%s unusable: %s", name, version, why)
            self._found[(name, version)] = why
            return
        if bound:
            heads.embedding_version = version
        registry = self._registry
        # the embedding model looked up per call: a closed version is never used
        classifier = ModerationClassifier(heads, lambda m: registry.embedding_models.get(m))
        self._found[(name, version)] = classifier
        log.info("moderation: heads %s version %s for %s@%s (covers %s)", heads.name,
                 heads.version, name, version, ", ".join(sorted(classifier.covered)))  # fmt: skip

    def current(self) -> tuple[ModerationClassifier | None, str]:
        """The classifier of the first served embedding model (by name) whose served
        version has usable heads; else None and why."""
        served = self._registry.embedding_models
        if not served:
            return None, (
                "no embedding model is served (moderation reads all-minilm-l6-v2's vectors)"
            )
        reasons = []
        for name in sorted(served):
            version = served[name].version
            found = self._found.get((name, version))
            if isinstance(found, ModerationClassifier):
                why_not = found.unavailable_reason()
                if why_not is None:
                    return found, ""
                reasons.append(why_not)
            else:
                reasons.append(
                    found
                    or f"{name}@{version} has no moderation heads (python -m models build "
                    "bundles them into its artifact; publish that again)"
                )
        return None, "; ".join(reasons)

    def say_at_start(self) -> None:
        classifier, why_not = self.current()
        if classifier is None:
            log.warning("moderation unavailable: %s", why_not)
