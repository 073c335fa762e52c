from agent.engine.stops import StopMatcher


def feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


def test_no_stops_passes_text_through() -> None:
    assert feed_all(StopMatcher([]), ["Hello", " world"]) == "Hello world"


def test_stop_inside_one_delta_truncates_and_stops() -> None:
    m = StopMatcher(["END"])
    assert m.feed("abc END def") == "abc "
    assert m.stopped
    assert m.feed("more") == ""


def test_stop_spanning_deltas_is_held_then_dropped() -> None:
    m = StopMatcher(["\n\nUser:"])
    emitted = [m.feed("Answer.\n"), m.feed("\nUs"), m.feed("er:")]
    assert "".join(emitted) == "Answer."
    assert m.stopped


def test_partial_stop_released_when_it_does_not_complete() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("ST") == ""
    assert m.feed("AR") == "STAR"
    assert m.feed("S") == ""
    assert m.flush() == "S"
    assert not m.stopped


def test_earliest_of_several_stops_wins() -> None:
    m = StopMatcher(["b", "a"])
    assert m.feed("xxabyy") == "xx"
