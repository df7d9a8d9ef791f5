"""Webhook addresses under attack (issue 60, finding 2), with a resolver
the test controls: a non-ASCII name that resolves to a public address for
the check and to a private one a moment later (DNS rebinding) is still
connected at the address checked; NAT64 and IPv4-compatible IPv6 forms of
private addresses are refused; a refusal never says what a name resolved
to (it would map the operator's DNS for the tenant who asks)."""

from __future__ import annotations

import socket

import httpcore
import httpx
import pytest

from tests.webhooks.helpers import endpoint_post
from webhooks.addresses import endpoint_url_pinned
from webhooks.services import attempt_post

pytestmark = pytest.mark.django_db
PUBLIC, PRIVATE = "93.184.215.14", "10.0.0.7"


@pytest.fixture
def rebinding(monkeypatch):
    """A name's first answer public, every later one private; the names asked."""
    asked: list[str] = []

    def resolve(host, port, *args, **kwargs):
        asked.append(host)
        address = PUBLIC if len(asked) == 1 else PRIVATE
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    return asked


def test_a_rebinding_idn_name_is_connected_at_the_address_checked(rebinding, monkeypatch):
    connected: list[str] = []

    async def connect(self, host, port, **kwargs):
        connected.append(host)
        raise httpcore.ConnectError("the test stops here")

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect)
    url = "https://ü.attacker.example/hook"
    host, address = endpoint_url_pinned(url)
    assert address == PUBLIC
    with pytest.raises(httpx.ConnectError):
        attempt_post(url, host=host, address=address, body="{}", headers={})
    # The client asks for xn--tda.attacker.example: it was resolved again
    # (to 10.0.0.7) while the pin compared the name in its Unicode form.
    assert connected == [PUBLIC]
    assert len(rebinding) == 1  # the check's, and no other


@pytest.mark.parametrize(
    "address", ["64:ff9b::a00:7", "64:ff9b:1::a9fe:a9fe", "::10.0.0.7", "2002:a00:7::1"]
)
def test_ipv6_forms_of_private_addresses_are_refused(api, world_a, address):
    answer = endpoint_post(api, world_a.owner.user, f"https://[{address}]/hooks", ["invoice.paid"])
    assert answer.status_code == 400, answer.json()
    assert "non-public address" in answer.json()["error"]["message"]


def test_a_refusal_never_says_what_a_name_resolved_to(api, world_a, monkeypatch):
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PRIVATE, port))],
    )
    answer = endpoint_post(
        api, world_a.owner.user, "https://intranet.example.com/x", ["invoice.paid"]
    )
    assert answer.status_code == 400
    assert "non-public address" in answer.json()["error"]["message"]
    assert PRIVATE not in str(answer.json())
