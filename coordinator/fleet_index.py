"""Which agents serve a model, by site and by place: the router's candidate lookup.

The index holds agent ids only; it changes when an agent's Hello does (models, site,
location), never on load reports. Places are bucketed in 1-degree cells; the nearest
agents are found by scanning rings of cells outwards.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

from coordinator.fleet import AgentHello, Location

Cell = tuple[int, int]
_MAX_RING = 180


def cell_of(location: Location) -> Cell:
    return math.floor(location.lat), math.floor(location.lon)


class FleetIndex:
    def __init__(self) -> None:
        self._by_model: dict[str, set[str]] = defaultdict(set)
        self._by_site: dict[str, set[str]] = defaultdict(set)
        self._by_cell: dict[Cell, set[str]] = defaultdict(set)
        self._unplaced: set[str] = set()
        self._hellos: dict[str, AgentHello] = {}

    def put(self, hello: AgentHello) -> None:
        """Index (or re-index) an agent by its latest Hello."""
        self.remove(hello.agent_id)
        agent_id = hello.agent_id
        self._hellos[agent_id] = hello
        for model in {m.name for m in hello.models}:
            self._by_model[model].add(agent_id)
        self._by_site[hello.site].add(agent_id)
        if hello.location is None:
            self._unplaced.add(agent_id)
        else:
            self._by_cell[cell_of(hello.location)].add(agent_id)

    def remove(self, agent_id: str) -> None:
        hello = self._hellos.pop(agent_id, None)
        if hello is None:
            return
        for model in {m.name for m in hello.models}:
            _discard(self._by_model, model, agent_id)
        _discard(self._by_site, hello.site, agent_id)
        if hello.location is None:
            self._unplaced.discard(agent_id)
        else:
            _discard(self._by_cell, cell_of(hello.location), agent_id)

    def serving(self, model: str) -> set[str]:
        """Every agent whose Hello lists ``model``."""
        return self._by_model.get(model, set())

    def candidates(
        self, model: str, *, site: str, location: Location | None, pool: int
    ) -> set[str]:
        """Agents serving ``model`` worth scoring: the client's site, then the nearest ones.

        With no site match and no location every agent serving the model is returned.
        """
        serving = self.serving(model)
        if not serving:
            return set()
        chosen = serving & self._by_site.get(site, set()) if site else set()
        if location is None:
            if chosen:
                return chosen
            return set(serving)
        if len(serving) <= pool:
            return set(serving)
        lat0, lon0 = cell_of(location)
        found: set[str] = set()
        ring = 0
        extra_rings = -1
        looked = 0
        while ring <= _MAX_RING:
            cells = _ring(lat0, lon0, ring)
            looked += len(cells)
            if looked > 4 * len(serving):
                # A sparse fleet: scoring them all is cheaper than scanning empty cells.
                return set(serving)
            for cell in cells:
                ids = self._by_cell.get(cell)
                if ids:
                    found |= ids & serving
            if extra_rings < 0 and len(found) >= pool:
                # One more ring: cells are not circles, a nearer agent may sit just outside.
                extra_rings = 1
            elif extra_rings >= 0:
                extra_rings -= 1
                if extra_rings < 0:
                    break
            ring += 1
        if len(found) > pool:
            found = set(self._nearest(found, location, pool))
        elif len(found) < pool:
            found |= serving & self._unplaced
        return chosen | found

    def _nearest(self, ids: set[str], location: Location, count: int) -> list[str]:
        """The ``count`` ids nearest to ``location`` (equirectangular: cheap, fine for ranking)."""
        cos_lat = math.cos(math.radians(location.lat))
        hellos = self._hellos

        def squared(agent_id: str) -> float:
            where = hellos[agent_id].location
            if where is None:
                return math.inf
            dlon = (where.lon - location.lon + 180.0) % 360.0 - 180.0
            return (where.lat - location.lat) ** 2 + (dlon * cos_lat) ** 2

        return heapq.nsmallest(count, ids, key=squared)


def _ring(lat0: int, lon0: int, radius: int) -> list[Cell]:
    if radius == 0:
        return [(lat0, lon0)]
    cells: list[Cell] = []
    for dlat in range(-radius, radius + 1):
        lat = lat0 + dlat
        if lat < -90 or lat > 89:
            continue
        if abs(dlat) == radius:
            lons = range(lon0 - radius, lon0 + radius + 1)
        else:
            lons = range(lon0 - radius, lon0 + radius + 1, 2 * radius)
        cells.extend((lat, _wrap_lon(lon)) for lon in lons)
    return cells


def _wrap_lon(lon: int) -> int:
    return (lon + 180) % 360 - 180


def _discard(index: dict[str, set[str]] | dict[Cell, set[str]], key: object, agent_id: str) -> None:
    ids = index.get(key)  # type: ignore[call-overload]
    if ids is not None:
        ids.discard(agent_id)
        if not ids:
            del index[key]  # type: ignore[arg-type]
