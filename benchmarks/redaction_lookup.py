"""``python -m benchmarks.redaction_lookup --site DIR [--repeat 7]``: whether an Aho-Corasick
automaton would find the gazetteer's names faster than what the name detector does now.

The detector scans for runs of capitalised words with one regular expression and looks each
word up in Python sets; an automaton over every gazetteer word (about 61,000) finds them in
one pass in C. Measured side by side on the held-out text, CPU time of one thread (the
median of ``--repeat`` passes, one call per document, as the agent calls it):

- ``cap_run_and_sets``: the detector's capitalised-run scan and set lookups (what an
  automaton would replace);
- ``pyahocorasick``: ``Automaton.iter`` over every document, whole-word hits kept;
- ``ahocorasick_rs``: ``AhoCorasick(..., MatchKind.LeftmostLongest).find_matches_as_indexes``,
  whole-word hits kept;
- ``find_persons``: the whole name detector (scan, lookups and context rules).

The automata are not dependencies of edgefleet: install them into a folder of their own
(``pip install --target DIR pyahocorasick==2.3.1 ahocorasick-rs==1.0.3``) and name it with
``--site``. Writes ``benchmarks/results/redaction_lookup.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.redaction import PINNED, SETS, check_pinned
from benchmarks.redaction_data import DATA_DIR, load_documents
from benchmarks.results_file import target, write_results


def cpu_mb_per_s(texts: list[str], fn: Callable[[str], object], repeat: int) -> float:
    size = sum(len(t.encode()) for t in texts)
    runs = []
    for _ in range(repeat):
        started = time.thread_time()
        for t in texts:
            fn(t)
        runs.append(time.thread_time() - started)
    return round(size / statistics.median(runs) / 1e6, 2)


def _whole_word(text: str, start: int, end: int) -> bool:
    return (start == 0 or not text[start - 1].isalnum()) and (
        end == len(text) or not text[end].isalnum()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, required=True, help="folder with the automata")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(args.site))
    import ahocorasick  # type: ignore[import-not-found]
    import ahocorasick_rs  # type: ignore[import-not-found]

    from agent.redaction import names

    path = DATA_DIR / SETS["heldout_world"]
    check_pinned(path)
    texts = [d.text for d in load_documents(path)]
    given, family, _, _ = names.gazetteer()
    words = sorted(given | family)
    print(f"building automata over {len(words)} words ...", flush=True)
    automaton = ahocorasick.Automaton()
    for w in words:
        automaton.add_word(w, len(w))
    automaton.make_automaton()
    rs = ahocorasick_rs.AhoCorasick(words, matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)

    def cap_run_and_sets(t: str) -> list[str]:
        return [
            w
            for m in names._CAP_RUN.finditer(t)
            for w in m.group().split(" ")
            if w in given or w in family
        ]

    def pyac(t: str) -> list[int]:
        return [end for end, n in automaton.iter(t) if _whole_word(t, end + 1 - n, end + 1)]

    def rsac(t: str) -> list[tuple[int, int]]:
        return [(a, b) for _, a, b in rs.find_matches_as_indexes(t) if _whole_word(t, a, b)]

    figures: dict[str, Any] = {
        "file": path.name,
        "sha256": PINNED[path.name],
        "gazetteer_words": len(words),
        "versions": {
            "pyahocorasick": metadata.version("pyahocorasick"),
            "ahocorasick-rs": metadata.version("ahocorasick-rs"),
        },
        "cpu_mb_per_s": {},
    }
    for label, fn in (
        ("cap_run_and_sets", cap_run_and_sets),
        ("pyahocorasick", pyac),
        ("ahocorasick_rs", rsac),
        ("find_persons", lambda t: list(names.find_persons(t))),
    ):
        figures["cpu_mb_per_s"][label] = cpu_mb_per_s(texts, fn, args.repeat)
        print(f"{label}: {figures['cpu_mb_per_s'][label]} MB/s", flush=True)
    speeds = figures["cpu_mb_per_s"]
    # what the automaton could save at best: the lookups' share of the name detector's time
    share = speeds["find_persons"] / speeds["cap_run_and_sets"]
    figures["lookup_share_of_find_persons"] = round(share, 3)
    best = max(speeds["pyahocorasick"], speeds["ahocorasick_rs"])
    targets = {
        "automaton_vs_lookups": target(
            round(best / speeds["cap_run_and_sets"], 2),
            "automaton MB/s / cap-run-and-sets MB/s (> 1: the automaton is faster)",
            best > speeds["cap_run_and_sets"],
        )
    }
    print(write_results("redaction_lookup", figures, targets))


if __name__ == "__main__":
    main()
