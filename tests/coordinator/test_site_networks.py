"""Client IP to site: the ``site_networks`` setting and the lookup the router does with it."""

from __future__ import annotations

import pytest

from coordinator.routing.site_networks import parse_site_networks, site_of

pytestmark = pytest.mark.timeout(10)

NETWORKS = parse_site_networks(
    " 10.1.0.0/16=berlin , 10.1.7.0/24 = berlin-lab,10.2.0.0/16=munich,"
    "2001:db8:1::/48=berlin-v6,, 192.168.0.0/16=home"
)


@pytest.mark.parametrize(
    ("ip", "site"),
    [
        ("10.1.2.3", "berlin"),
        ("10.1.7.9", "berlin-lab"),  # the most specific network wins, whatever the order
        ("10.2.255.1", "munich"),
        ("2001:db8:1:42::7", "berlin-v6"),
        ("::ffff:10.2.0.5", "munich"),  # an IPv4 client on a dual-stack listener
        ("10.3.0.1", ""),  # in no network
        ("2001:db8:2::1", ""),
        ("not-an-ip", ""),
        ("", ""),
    ],
)
def test_site_of(ip: str, site: str) -> None:
    assert site_of(ip, NETWORKS) == site


def test_entries_are_trimmed_and_most_specific_first() -> None:
    assert [(str(n), s) for n, s in NETWORKS][:2] == [
        ("2001:db8:1::/48", "berlin-v6"),
        ("10.1.7.0/24", "berlin-lab"),
    ]
    assert parse_site_networks("") == () and parse_site_networks(" , ") == ()
    # Host bits are allowed (and cleared): 10.1.2.3/16 is 10.1.0.0/16.
    assert site_of("10.1.200.1", parse_site_networks("10.1.2.3/16=berlin")) == "berlin"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.1.0.0/16", "entry '10.1.0.0/16' must look like CIDR=site"),
        ("10.1.0.0/16=", "must look like CIDR=site"),
        ("10.1.0.0/16=  ", "must look like CIDR=site"),
        ("10.1.0.0/33=berlin", "entry '10.1.0.0/33=berlin'"),
        ("berlin=10.1.0.0/16", "entry 'berlin=10.1.0.0/16'"),
        ("10.1.0.0/16=a, 10.1.0.0/16=b", "10.1.0.0/16 is already given to site 'a'"),
    ],
)
def test_malformed_entries_are_named_in_the_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_site_networks(text)


def test_the_same_network_for_the_same_site_twice_is_harmless() -> None:
    assert site_of("10.1.0.1", parse_site_networks("10.1.0.0/16=a,10.1.0.0/16=a")) == "a"
