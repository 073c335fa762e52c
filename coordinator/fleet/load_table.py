"""Every agent's routing inputs as columns of numpy arrays: what a lookup scores, read in bulk.

A route lookup filters and scores dozens of candidates. Read from the records one
attribute at a time, in Python, that was most of a lookup's cost (about 250 us of the
route decision for 64 candidates on a 5,000-agent fleet); read from these columns with
one fancy index per column, the router's fast path (``RouteScorer.rank_rows``) scores
them in a few numpy operations. The registry keeps the table in step: every record it
stores goes through ``put`` (a handful of scalar writes: about a microsecond per load
report) and every agent it forgets through ``discard``.

Rows are reused when agents leave (a free list), so the arrays never shift and a row
number stays valid for as long as its agent is on record. Columns:

``code``
    Why the agent cannot take a route whatever the query asks (``EXCLUDED`` names
    them, in the scorer's order of precedence), or ``ROUTABLE``.
``load``, ``kv``
    From its last load report: running + waiting sequences, KV-cache fraction (0
    before the first report).
``wait_ms``, ``rest``
    What the router's policy makes of the report (``derive``): the predicted wait, and
    the part of the score that depends on nothing but the agent (its KV and wait terms).
``factor``
    1, or the scorer's factor for a suspect or unconfirmed agent.
``seen``, ``watch``
    For the liveness sweep (``sweep_candidates``): when it was last seen (POSIX
    seconds), and whether the sweep need look at it: never (down), when it has been
    silent long enough (live or suspect, connected), or always (unconfirmed, or its
    session ended); never either for an agent whose session is on another coordinator
    (its liveness is that coordinator's: coordinator/cluster/live_view.py).
``site``
    Its site as a small integer (``site_code``); ``placed``, ``lat`` (radians),
    ``cos_lat`` and ``lon`` (degrees): its place, as the scorer's haversine uses it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from coordinator.fleet.records import AgentRecord, AgentStatus, Liveness
from edgefleet.contract import Hello

ROUTABLE = 0
#: Exclusion reasons by code, in the order the scorer checks them (first applies).
EXCLUDED = ("", "down", "unhealthy", "draining", "no_http_url", "saturated")
_DOWN, _UNHEALTHY, _DRAINING, _NO_URL, SATURATED = 1, 2, 3, 4, 5
_DEMOTED = frozenset({Liveness.SUSPECT, Liveness.UNCONFIRMED})
# ``watch``: the sweep never looks at the agent, when it is silent long enough, always
_UNWATCHED, _WHEN_SILENT, _ALWAYS = 0, 1, 2

#: The router's policy applied to one report: (waiting, load, KV fraction, tokens/s)
#: -> (``ROUTABLE`` or ``SATURATED``, predicted wait ms, the agent-only score part).
Derive = Callable[[int, int, float, float], tuple[int, float, float]]
_FIRST_CAPACITY = 64
#: ``site_code`` of a site no agent is at: matches no row.
NO_SITE = -2

Floats = npt.NDArray[np.float64]


class LoadTable:
    """One row per agent on record (see the module doc)."""

    def __init__(self) -> None:
        self.row: dict[str, int] = {}
        # row -> its agent's record, and the Hello its place/site columns were made from
        self.records: list[AgentRecord | None] = []
        self._hellos: list[Hello | None] = []
        self._free: list[int] = []
        # row -> the models its agent serves but does not hold in memory now (by name)
        self.cold: dict[int, frozenset[str]] = {}
        self._sites: dict[str, int] = {"": -1}
        # the policy's derive() and what identifies it (None: wait_ms, rest not filled)
        self._derive: Derive | None = None
        self.derived_for: object = None
        self._demoted_factor = 1.0
        n = _FIRST_CAPACITY
        self.code = np.zeros(n, np.int8)
        self.load: Floats = np.zeros(n)
        self.kv: Floats = np.zeros(n)
        self.wait_ms: Floats = np.zeros(n)
        self.rest: Floats = np.zeros(n)
        self.factor: Floats = np.ones(n)
        self.seen: Floats = np.zeros(n)
        self.watch = np.zeros(n, np.int8)
        self.site = np.full(n, -1, np.int32)
        self.placed = np.zeros(n, np.bool_)
        self.lat: Floats = np.zeros(n)
        self.cos_lat: Floats = np.zeros(n)
        self.lon: Floats = np.zeros(n)

    def __len__(self) -> int:
        return len(self.row)

    _COLUMNS = ("code", "load", "kv", "wait_ms", "rest", "factor", "seen", "watch", "site",
                "placed", "lat", "cos_lat", "lon")  # fmt: skip

    def derive_with(self, policy: object, derive: Derive, demoted_factor: float) -> None:
        """Fill ``wait_ms``, ``rest``, saturation and ``factor`` by ``derive`` from now on
        (every row again now); ``policy`` is what ``derived_for`` then names."""
        self._derive, self.derived_for, self._demoted_factor = derive, policy, demoted_factor
        for record in self.records:
            if record is not None:
                self.put(record)

    def _new_row(self, agent_id: str) -> int:
        if self._free:
            at = self._free.pop()
        else:
            at = len(self.records)
            if at == len(self.code):
                for name in self._COLUMNS:
                    column = getattr(self, name)
                    grown = np.zeros(2 * at, column.dtype)
                    grown[:at] = column
                    setattr(self, name, grown)
            self.records.append(None)
            self._hellos.append(None)
        self.row[agent_id] = at
        return at

    def put(self, record: AgentRecord) -> None:
        """``record`` is its agent's current one (new agent, report, liveness, drain...)."""
        hello = record.hello
        at = self.row.get(hello.agent_id)
        if at is None:
            at = self._new_row(hello.agent_id)
        self.records[at] = record
        if self._hellos[at] is not hello:
            self._hellos[at] = hello
            site = self._sites.get(hello.site)
            if site is None:
                site = self._sites[hello.site] = len(self._sites) - 1
            self.site[at] = site
            where = hello.location
            self.placed[at] = where is not None
            if where is not None:
                lat = math.radians(where.lat)
                self.lat[at], self.cos_lat[at], self.lon[at] = lat, math.cos(lat), where.lon
        report = record.last_report
        code = ROUTABLE
        if record.liveness is Liveness.DOWN:
            code = _DOWN
        elif report is not None and report.unhealthy_reason:
            code = _UNHEALTHY
        elif record.draining or (report is not None and report.draining):
            code = _DRAINING
        elif not hello.http_url:
            code = _NO_URL
        liveness = record.liveness
        self.factor[at] = self._demoted_factor if liveness in _DEMOTED else 1.0
        self.seen[at] = record.last_seen.timestamp()
        if liveness is Liveness.DOWN or record.remote:  # a remote one: its coordinator's
            self.watch[at] = _UNWATCHED
        elif liveness is Liveness.UNCONFIRMED or record.status is not AgentStatus.CONNECTED:
            self.watch[at] = _ALWAYS
        else:
            self.watch[at] = _WHEN_SILENT
        if report is None:
            waiting = load = 0
            kv = rate = 0.0
        else:
            waiting = report.waiting_sequences
            load = report.running_sequences + waiting
            kv, rate = report.kv_cache_used_fraction, report.tokens_per_second
        if report is not None and report.cold_models:
            self.cold[at] = frozenset(name for name, _ in report.cold_models)
        elif self.cold:
            self.cold.pop(at, None)
        self.load[at], self.kv[at] = load, kv
        if self._derive is not None:
            saturated, self.wait_ms[at], self.rest[at] = self._derive(waiting, load, kv, rate)
            if code == ROUTABLE:
                code = saturated
        self.code[at] = code

    def discard(self, agent_id: str) -> None:
        at = self.row.pop(agent_id, None)
        if at is None:
            return
        self.records[at] = self._hellos[at] = None
        self.cold.pop(at, None)
        self.code[at] = _DOWN  # never read through ``row``; kept unroutable all the same
        self.watch[at] = _UNWATCHED
        self._free.append(at)

    def sweep_candidates(self, silent_since: float) -> list[str]:
        """The agents the liveness sweep must look at: every one it ever looks at
        (unconfirmed, or without a session) and those not seen after ``silent_since``
        (POSIX seconds; give it a little late, as timestamps round); never a down one.
        A superset: the sweep decides each one exactly, from its record."""
        n = len(self.records)
        watch = self.watch[:n]
        rows = np.flatnonzero(
            (watch == _ALWAYS) | ((watch == _WHEN_SILENT) & (self.seen[:n] <= silent_since))
        )
        records = self.records
        return [records[row].agent_id for row in rows.tolist()]  # type: ignore[union-attr]

    def site_code(self, site: str) -> int:
        """``site`` as the ``site`` column holds it (``NO_SITE``: no agent there)."""
        return self._sites.get(site, NO_SITE)

    def rows_of(self, agent_ids: Iterable[str]) -> npt.NDArray[np.intp]:
        """The rows of those of ``agent_ids`` on record."""
        row = self.row
        ids = agent_ids if isinstance(agent_ids, (list, tuple, set, frozenset)) else list(agent_ids)
        if len(ids) > 1:
            try:  # every one on record (the router's candidates): one C call
                return np.array(operator.itemgetter(*ids)(row), np.intp)
            except KeyError:
                pass
        return np.fromiter((row[i] for i in ids if i in row), np.intp)


class TableRecords(dict[str, AgentRecord]):
    """The registry's records by agent id, each change mirrored into ``table``.

    Every way a record enters or leaves goes through the table, so no code path that
    replaces a record can leave the router reading an older one; the dict methods that
    would bypass it are refused."""

    __slots__ = ("table",)

    def __init__(self, table: LoadTable) -> None:
        super().__init__()
        self.table = table

    def __setitem__(self, agent_id: str, record: AgentRecord) -> None:
        super().__setitem__(agent_id, record)
        self.table.put(record)

    def __delitem__(self, agent_id: str) -> None:
        super().__delitem__(agent_id)
        self.table.discard(agent_id)

    def pop(self, agent_id: str, *default: object) -> AgentRecord:
        record = super().pop(agent_id, *default)
        self.table.discard(agent_id)
        return record

    def _bypass(self, *args: object, **kwargs: object) -> None:
        raise TypeError("TableRecords changes one record at a time ([k] = v, del, pop)")

    update = setdefault = popitem = clear = _bypass  # type: ignore[assignment]
    __ior__ = _bypass  # type: ignore[assignment]
