"""Which agents serve a model, by site and by place: the router's candidate lookup.

The index holds agent ids and places only; it changes when an agent's Hello does
(models, site, location), never on load reports. Places are bucketed in 1-degree
cells, per model, so a lookup never intersects sets; the nearest agents are found by
scanning rings of cells outwards and ranking what was found by a cheap planar
(equirectangular) distance on coordinates stored next to the ids in their cell, in
arrays of doubles: a lookup reads a few hundred places from contiguous memory, not from
as many objects strewn over a large heap (in a coordinator serving 5,000 agents the
lookup took three times as long that way). The cells of a ring are computed once per
(cell, radius) and kept (``_ring``: a bounded cache).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from array import array
from collections.abc import Iterable
from typing import TypeVar

from edgefleet.contract import Hello, Location

Cell = tuple[int, int]
_MAX_RING = 180
K = TypeVar("K")


def cell_of(location: Location) -> Cell:
    return math.floor(location.lat), math.floor(location.lon)


class _Cell:
    """The placed agents serving one model in one cell: their ids, and their latitudes
    and longitudes at the same positions."""

    __slots__ = ("ids", "lats", "lons")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lats = array("d")
        self.lons = array("d")

    def add(self, agent_id: str, lat: float, lon: float) -> None:
        self.ids.append(agent_id)
        self.lats.append(lat)
        self.lons.append(lon)

    def discard(self, agent_id: str) -> None:
        try:
            at = self.ids.index(agent_id)
        except ValueError:
            return
        del self.ids[at], self.lats[at], self.lons[at]


class FleetIndex:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        # model -> agent ids serving it
        self._by_model: dict[str, set[str]] = {}
        # site -> agent ids there
        self._by_site: dict[str, set[str]] = {}
        # model -> cell -> the agents serving the model there, with their places
        self._cells: dict[str, dict[Cell, _Cell]] = {}
        # model -> agent ids serving it without a location
        self._unplaced: dict[str, set[str]] = {}
        # agent id -> (lat, lon) for placed agents
        self._places: dict[str, tuple[float, float]] = {}
        self._hellos: dict[str, Hello] = {}

    def __len__(self) -> int:
        return len(self._hellos)

    def put(self, hello: Hello) -> None:
        """Index (or re-index) an agent by its latest Hello."""
        self.remove(hello.agent_id)
        agent_id = hello.agent_id
        self._hellos[agent_id] = hello
        where = hello.location
        if where is not None:
            self._places[agent_id] = (where.lat, where.lon)
        _add(self._by_site, hello.site, agent_id)
        for model in _model_names(hello):
            _add(self._by_model, model, agent_id)
            if where is None:
                _add(self._unplaced, model, agent_id)
            else:
                cells = self._cells.setdefault(model, {})
                here = cells.get(cell := cell_of(where))
                if here is None:
                    here = cells[cell] = _Cell()
                here.add(agent_id, where.lat, where.lon)

    def remove(self, agent_id: str) -> None:
        hello = self._hellos.pop(agent_id, None)
        if hello is None:
            return
        self._places.pop(agent_id, None)
        _discard(self._by_site, hello.site, agent_id)
        for model in _model_names(hello):
            _discard(self._by_model, model, agent_id)
            if hello.location is None:
                _discard(self._unplaced, model, agent_id)
            else:
                cells = self._cells.get(model)
                if cells is not None:
                    cell = cell_of(hello.location)
                    here = cells.get(cell)
                    if here is not None:
                        here.discard(agent_id)
                        if not here.ids:
                            del cells[cell]
                    if not cells:
                        del self._cells[model]

    def at_site(self, site: str) -> frozenset[str] | set[str]:
        """Every agent at ``site`` (do not mutate the result)."""
        return self._by_site.get(site, frozenset())

    def serving(self, model: str) -> frozenset[str] | set[str]:
        """Every agent whose Hello lists ``model`` (do not mutate the result)."""
        return self._by_model.get(model, frozenset())

    def candidates(
        self, model: str, *, site: str, location: Location | None, pool: int
    ) -> set[str]:
        """Agents serving ``model`` worth scoring: the client's site, then the nearest ones.

        With no location, the client's site if any agent there serves the model, else
        every agent serving it. With a location: the site's agents, the ``pool`` nearest
        placed ones, and the agents of unknown place. An unknown place is not far away:
        such agents cannot lose a distance comparison, so they always take part (the
        scorer gives them a neutral proximity); when more than ``pool`` serve the model,
        ``pool`` of them chosen at random, so the same few are not always the ones asked.
        """
        serving = self._by_model.get(model)
        if not serving:
            return set()
        at_site = self._by_site.get(site) if site else None
        chosen = serving & at_site if at_site else set()
        if location is None:
            return chosen if chosen else set(serving)
        if len(serving) <= pool:
            return set(serving)
        found = self._near(model, location, pool, len(serving))
        if found is None:  # a sparse fleet: scoring them all is cheaper than scanning
            return set(serving)
        unplaced = self._unplaced.get(model, set())
        if len(unplaced) > pool:
            unplaced = set(self._rng.sample(list(unplaced), pool))
        return chosen | set(found) | unplaced

    def _near(self, model: str, location: Location, pool: int, serving: int) -> list[str] | None:
        """The ``pool`` placed agents nearest to ``location`` (fewer when fewer are placed).

        Scans rings of cells outwards until the ``pool``-th nearest agent found is
        nearer than any cell not scanned yet, so the answer is exact for the planar
        distance. None when that means scanning more cells than there are agents.
        """
        cells = self._cells.get(model, {})
        lat, lon = location.lat, location.lon
        cos_lat = max(math.cos(math.radians(lat)), 1e-6)
        lat0, lon0 = cell_of(location)
        # The agents found so far and their planar distances, side by side (floats in a
        # list: no tuple per agent).
        ids: list[str] = []
        dists: list[float] = []
        looked = 0
        for ring in range(_MAX_RING + 1):
            ring_cells = _ring(lat0, lon0, ring)
            looked += len(ring_cells)
            if looked > 4 * serving:
                return None
            for cell in ring_cells:
                here = cells.get(cell)
                if here is not None:
                    ids += here.ids
                    # _planar, inlined: a lookup measures hundreds of agents
                    dists += [
                        (dlat := la - lat) * dlat
                        + (dlon := ((lo - lon + 180.0) % 360.0 - 180.0) * cos_lat) * dlon
                        for la, lo in zip(here.lats, here.lons, strict=True)
                    ]
            if len(dists) < pool:
                continue
            # Nearest point outside the scanned square of cells (planar units).
            outside = min(
                lat - (lat0 - ring),
                lat0 + ring + 1 - lat,
                (lon - (lon0 - ring)) * cos_lat,
                (lon0 + ring + 1 - lon) * cos_lat,
            )
            best = _nearest_of(ids, dists, pool)
            if dists[best[-1]] <= outside * outside:
                return [ids[i] for i in best]
            if ring * 2 + 1 < 360 and len(dists) > 4 * pool:  # only the best can be kept
                ids, dists = [ids[i] for i in best], [dists[i] for i in best]
        return [ids[i] for i in _nearest_of(ids, dists, pool)]

    def nearest(self, ids: Iterable[str], location: Location, count: int) -> list[str]:
        """The ``count`` placed ids nearest to ``location``, nearest first (planar distance)."""
        lat, lon = location.lat, location.lon
        cos_lat = math.cos(math.radians(lat))
        places = self._places
        ranked = [
            (_planar(p, lat, lon, cos_lat), agent_id)
            for agent_id in ids
            if (p := places.get(agent_id)) is not None
        ]
        return [agent_id for _, agent_id in heapq.nsmallest(count, ranked)]


def _nearest_of(ids: list[str], dists: list[float], count: int) -> list[int]:
    """The positions of the ``count`` smallest distances, smallest first; equal distances
    by agent id (the order of (distance, id) pairs), so the answer is the same whatever
    order the agents were found in. Sorted by C's sort, keyed by the list itself."""
    order = sorted(range(len(dists)), key=dists.__getitem__)
    if len(order) > count and dists[order[count - 1]] == dists[order[count]]:
        # a tie across the cut: the tied ones in (distance, id) order
        edge = dists[order[count - 1]]
        inside = [i for i in order if dists[i] < edge]
        tied = sorted((i for i in order if dists[i] == edge), key=ids.__getitem__)
        return inside + tied[: count - len(inside)]
    return order[:count]


def _planar(place: tuple[float, float], lat: float, lon: float, cos_lat: float) -> float:
    """Squared equirectangular distance (degrees of latitude) between ``place`` and
    (lat, lon), longitudes wrapped across the antimeridian; ``cos_lat``: cos(lat)."""
    dlat = place[0] - lat
    dlon = ((place[1] - lon + 180.0) % 360.0 - 180.0) * cos_lat
    return dlat * dlat + dlon * dlon


def _model_names(hello: Hello) -> set[str]:
    return {m.name for m in hello.models}


@functools.lru_cache(maxsize=8192)
def _ring(lat0: int, lon0: int, radius: int) -> tuple[Cell, ...]:
    """The cells at Chebyshev distance ``radius`` from (lat0, lon0), clipped at the poles
    and wrapped across the antimeridian (the same for every lookup: cached)."""
    if radius == 0:
        return ((lat0, lon0),)
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
    return tuple(cells)


def _wrap_lon(lon: int) -> int:
    return (lon + 180) % 360 - 180


def _add(index: dict[K, set[str]], key: K, agent_id: str) -> None:
    ids = index.get(key)
    if ids is None:
        index[key] = {agent_id}
    else:
        ids.add(agent_id)


def _discard(index: dict[K, set[str]], key: K, agent_id: str) -> None:
    ids = index.get(key)
    if ids is not None:
        ids.discard(agent_id)
        if not ids:
            del index[key]
