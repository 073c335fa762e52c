"""The fleet index: candidates by model, site and place (exact nearest by great-circle
distance, re-indexing)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from coordinator.fleet.index import _SAMPLE_EVERY, FleetIndex, _smallest
from coordinator.routing.scorer import great_circle_km
from edgefleet.contract import Hello, LoadedModel, Location

pytestmark = pytest.mark.timeout(30)


def hello(
    agent_id: str,
    location: Location | None,
    *,
    site: str = "",
    models: tuple[str, ...] = ("m",),
) -> Hello:
    return Hello(
        agent_id=agent_id,
        site=site,
        http_url=f"http://{agent_id}:8000",
        location=location,
        models=tuple(LoadedModel(name, "v1") for name in models),
    )


def random_fleet(count: int, seed: int = 3) -> list[Hello]:
    rng = random.Random(seed)
    return [
        hello(
            f"a{i:04d}",
            Location(rng.uniform(36.0, 60.0), rng.uniform(-9.0, 30.0)),
            site=f"s{rng.randrange(50)}",
            models=("m",) if i % 3 else ("m", "other"),
        )
        for i in range(count)
    ]


def test_candidates_are_exactly_the_nearest_pool() -> None:
    fleet = random_fleet(3000)
    index = FleetIndex()
    for h in fleet:
        index.put(h)
    rng = random.Random(11)
    for _ in range(50):
        client = Location(rng.uniform(36.0, 60.0), rng.uniform(-9.0, 30.0))
        got = index.candidates("m", site="", location=client, pool=40)
        expected = index.nearest([h.agent_id for h in fleet], client, 40)
        assert got == set(expected)


@pytest.mark.parametrize("n, k", [(100, 10), (5000, 64), (5000, 1), (20_000, 64), (3000, 200)])
def test_the_k_smallest_distances_are_found_whichever_way(n: int, k: int) -> None:
    """``_smallest`` narrows a large search by a bound from a sample of the distances: the
    values it returns are the k smallest, whatever the sample held. Checked on random
    distances (the sample's bound lets enough through), on ones where every sampled
    distance is tiny and the rest large (many pass), and on ones where only a few sampled
    distances are small (too few pass: the whole is partitioned instead)."""
    rng = np.random.default_rng(n + k)
    random_d = rng.random(n)
    sampled_small = rng.random(n) + 1.0
    sampled_small[::_SAMPLE_EVERY] = rng.random(len(sampled_small[::_SAMPLE_EVERY])) * 1e-3
    few_small = rng.random(n) + 1.0
    few = slice(0, 8 * _SAMPLE_EVERY, _SAMPLE_EVERY)
    few_small[few] = rng.random(len(few_small[few])) * 1e-3
    for d in (random_d, sampled_small, few_small):
        got = _smallest(d, k)
        assert len(set(got.tolist())) == k
        assert sorted(d[got].tolist()) == sorted(d.tolist())[:k]


def test_nearest_agrees_with_great_circle_on_a_city_scale() -> None:
    index = FleetIndex()
    places = {
        "berlin": Location(52.52, 13.405),
        "potsdam": Location(52.39, 13.06),
        "munich": Location(48.14, 11.58),
        "hamburg": Location(53.55, 9.99),
    }
    for name, where in places.items():
        index.put(hello(name, where))
    client = Location(52.45, 13.3)
    by_circle = sorted(places, key=lambda n: great_circle_km(client, places[n]))
    assert index.nearest(places, client, 4) == by_circle


def test_only_agents_serving_the_model_are_candidates() -> None:
    fleet = random_fleet(600)
    index = FleetIndex()
    for h in fleet:
        index.put(h)
    serving_other = {h.agent_id for h in fleet if any(m.name == "other" for m in h.models)}
    got = index.candidates("other", site="", location=Location(48.0, 10.0), pool=10)
    assert len(got) == 10
    assert got <= serving_other
    assert index.candidates("missing", site="", location=Location(48.0, 10.0), pool=10) == set()
    assert index.serving("other") == serving_other


def test_the_clients_site_is_always_a_candidate() -> None:
    fleet = random_fleet(600)
    index = FleetIndex()
    for h in fleet:
        index.put(h)
    far_away = hello("far", Location(-33.9, 151.2), site="client-site")
    index.put(far_away)
    got = index.candidates("m", site="client-site", location=Location(48.0, 10.0), pool=10)
    assert "far" in got
    assert len(got) == 11
    # Without a location: the site alone, or everyone serving the model when it has none.
    assert index.candidates("m", site="client-site", location=None, pool=10) == {"far"}
    assert len(index.candidates("m", site="nowhere", location=None, pool=10)) == len(fleet) + 1


def test_small_fleets_are_scored_whole_and_sparse_ones_by_the_nearest() -> None:
    index = FleetIndex()
    index.put(hello("a", Location(0.0, 0.0)))
    index.put(hello("b", Location(60.0, 170.0)))
    index.put(hello("c", None))
    assert index.candidates("m", site="", location=Location(1.0, 1.0), pool=64) == {"a", "b", "c"}
    # a fleet spread over the globe: the nearest, and the one of unknown place
    assert index.candidates("m", site="", location=Location(1.0, 1.0), pool=1) == {"a", "c"}
    assert index.candidates("m", site="", location=Location(59.0, -179.0), pool=1) == {"b", "c"}


def test_the_nearest_are_found_by_great_circle_distance_not_on_a_flat_map() -> None:
    """Near the pole, a degree of longitude is short: on a flat (lat, lon) map, scaled at
    the client's latitude, the agent half a world of longitude away looks farther than
    the one 2.5 degrees of latitude away, but over the pole it is the nearer."""
    index = FleetIndex()
    index.put(hello("same-meridian", Location(86.5, 0.0)))
    index.put(hello("across-the-pole", Location(89.0, 180.0)))
    for i in range(10):
        index.put(hello(f"far{i}", Location(-50.0, i * 10.0)))
    client = Location(89.0, 0.0)
    assert index.candidates("m", site="", location=client, pool=1) == {"across-the-pole"}
    assert great_circle_km(client, Location(89.0, 180.0)) < great_circle_km(
        client, Location(86.5, 0.0)
    )


def test_agents_of_unknown_place_always_take_part() -> None:
    # An unknown place is not 0N 0E: it cannot lose a distance comparison and fall out.
    index = FleetIndex()
    placed = random_fleet(200)
    for h in placed:
        index.put(h)
    index.put(hello("nowhere", None))
    got = index.candidates("m", site="", location=Location(48.0, 10.0), pool=20)
    assert "nowhere" in got and len(got) == 21
    # Many of them: at most a pool's worth, a different draw each time.
    crowd = FleetIndex(rng=random.Random(5))
    for h in placed:
        crowd.put(h)
    for i in range(50):
        crowd.put(hello(f"u{i:02d}", None))
    draws = [
        {a for a in crowd.candidates("m", site="", location=Location(48.0, 10.0), pool=20)
         if a.startswith("u")}
        for _ in range(3)
    ]  # fmt: skip
    assert all(len(d) == 20 for d in draws) and len({frozenset(d) for d in draws}) > 1


def test_reindexing_on_a_new_hello_moves_and_forgets_the_agent() -> None:
    index = FleetIndex()
    for i in range(100):
        index.put(hello(f"x{i}", Location(40.0 + i * 0.1, 0.0)))
    index.put(hello("mover", Location(10.0, 10.0), site="old", models=("m", "gone")))
    index.put(hello("mover", Location(-40.0, -70.0), site="new"))
    assert "mover" not in index.serving("gone")
    assert index.candidates("m", site="old", location=None, pool=5) != {"mover"}
    near_new = index.candidates("m", site="", location=Location(-40.0, -70.0), pool=1)
    assert near_new == {"mover"}
    index.remove("mover")
    assert "mover" not in index.serving("m")
    assert len(index) == 100
    index.remove("never-there")  # a no-op


def test_locations_across_the_antimeridian_are_near() -> None:
    index = FleetIndex()
    for i in range(100):
        index.put(hello(f"x{i}", Location(0.0, -60.0 + i * 0.5)))
    index.put(hello("east", Location(10.0, 179.9)))
    index.put(hello("west", Location(10.0, -179.9)))
    got = index.candidates("m", site="", location=Location(10.0, 179.5), pool=2)
    assert got == {"east", "west"}


def test_agents_at_one_place_are_cut_by_id_as_the_nearest_are() -> None:
    """A site's agents often share one place: when the pool ends among them, the ones
    taken are those with the smallest ids, whatever order they were indexed in (as
    nearest() ranks (distance, id) pairs); and agents leaving a cell keep it consistent."""
    rng = random.Random(5)
    places = [Location(rng.uniform(36.0, 60.0), rng.uniform(-9.0, 30.0)) for _ in range(40)]
    fleet = [hello(f"a{i:04d}", places[i % 40]) for i in range(1200)]
    rng.shuffle(fleet)
    index = FleetIndex()
    for h in fleet:
        index.put(h)
    for h in fleet[::7]:  # gone: their cells must not offer them
        index.remove(h.agent_id)
    left = [h.agent_id for h in fleet if h not in fleet[::7]]
    for i in range(60):
        client = places[i % 40] if i % 2 else Location(rng.uniform(36.0, 60.0), 10.0)
        got = index.candidates("m", site="", location=client, pool=45)
        assert got == set(index.nearest(left, client, 45))
