"""``python -m benchmarks.key_check [--keys 10000 --checks 200000]``: the cost of checking
an API key at the agent (SHA-256 of the presented secret, dict lookup, compare_digest,
expiry, the requests/min window and the usage counter), for a valid key and an unknown one,
next to the SHA-256 alone, in one run.

Writes ``benchmarks/results/key_check.json``; target: a check costs under 20 µs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

from agent.auth.keys import KeyTable, new_secret, secret_digest
from agent.errors import InvalidApiKeyError
from benchmarks.results_file import target, write_results
from edgefleet.contract import ApiKey


def _table(n: int) -> tuple[KeyTable, list[str]]:
    table = KeyTable(enabled=True)
    keys, secrets = [], []
    for i in range(n):
        key_id, secret = new_secret()
        secrets.append(secret)
        # Half the keys have rate limits (a window to take from on every check).
        rpm = 1e12 if i % 2 else 0.0
        keys.append(ApiKey(key_id, secret_digest(secret), requests_per_minute=rpm))
    table.set_source("coordinator", keys, 1)
    return table, secrets


def _per_call_us(call: Callable[[], object], n: int, repeats: int = 5) -> float:
    """Median over ``repeats`` runs of the mean µs per call."""
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(n):
            call()
        runs.append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(runs)


def _unknown(table: KeyTable, header: str) -> None:
    with contextlib.suppress(InvalidApiKeyError):
        table.authenticate(header)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000, help="keys in the table")
    parser.add_argument("--checks", type=int, default=200_000, help="checks per run")
    args = parser.parse_args()
    table, secrets = _table(args.keys)
    valid = [f"Bearer {s}" for s in secrets[:1000]]
    headers = iter(valid * (args.checks // len(valid) + 1) * 6)
    valid_us = _per_call_us(lambda: table.authenticate(next(headers)), args.checks)
    unknown_header = "Bearer ef-000000000000-" + "x" * 43
    unknown_us = _per_call_us(lambda: _unknown(table, unknown_header), args.checks)
    digest_us = _per_call_us(lambda: secret_digest(secrets[0]), args.checks)
    figures = {
        "keys_in_table": args.keys,
        "valid_key_check_us": round(valid_us, 3),
        "unknown_key_check_us": round(unknown_us, 3),
        "sha256_of_secret_us": round(digest_us, 3),
    }
    for name, value in figures.items():
        print(f"{name:34s} {value}")
    path = write_results(
        "key_check",
        figures,
        {"valid_key_check_us": target(valid_us, "< 20", valid_us < 20)},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
