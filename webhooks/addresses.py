"""Where an endpoint may point: https only (plain http to loopback in
development), and never at a private, link-local or otherwise non-public
address unless the operator allows it (WEBHOOKS_ALLOW_PRIVATE): a webhook
must not become a way into the operator's own network. Checked when an
endpoint is saved and again before every attempt (a name may resolve
elsewhere later), and the attempt connects to the address checked, not
to whatever the name resolves to a moment later."""

from __future__ import annotations

import ipaddress
import socket
import ssl
from functools import cache
from urllib.parse import urlsplit

import httpcore
import httpx
from django.conf import settings

from core.errors import InputError

PLAIN_REFUSED = "must be an https:// URL (plain http only to loopback in development)"


class AddressRefused(InputError):
    """An endpoint URL this product will not call."""


def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise AddressRefused("url", f"its host {host!r} does not resolve ({error})") from None
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _loopback_name(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def endpoint_url_check(url: str) -> str:
    """`url`, or AddressRefused naming `url` and why."""
    _checked(url)
    return url


def endpoint_url_pinned(url: str) -> tuple[str, str]:
    """The host of `url` and the address it is to be called at: one of
    those just checked (AddressRefused as endpoint_url_check). The delivery
    connects there (pinned_async_transport) and never asks the name again, so a
    name that resolves to a public address for the check and to a private
    one for the connection (DNS rebinding) reaches nothing it should not."""
    host, addresses = _checked(url)
    return host, str(addresses[0])


class _PinnedAsyncBackend(httpcore.AnyIOBackend):
    """Every connection goes to the address checked, whatever host name it
    is asked for: a delivery calls one endpoint and follows no redirect, so
    nothing here ever resolves a name again. (The sync one it replaces
    compared the host first, and a non-ASCII name, which the client asks
    for in its IDNA form, was resolved again: issue 60, finding 2.)"""

    def __init__(self, address: str) -> None:
        self.address = address

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return await super().connect_tcp(
            self.address,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )


def pinned_async_transport(host: str, address: str) -> httpx.AsyncHTTPTransport:
    """A transport that connects `host` to `address` (TLS still verifies
    the certificate against `host`). No proxy from the environment is used
    (httpx reads none once a transport is given): the egress control is
    the address check itself."""
    context = _ssl_context()
    transport = httpx.AsyncHTTPTransport(verify=context)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=context, network_backend=_PinnedAsyncBackend(address)
    )
    return transport


@cache
def _ssl_context() -> ssl.SSLContext:
    """The CA bundle loaded once per process, not per attempt."""
    return httpx.create_ssl_context()


def _checked(url: str) -> tuple[str, list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    parts = urlsplit(url or "")
    if parts.scheme not in {"https", "http"} or not parts.hostname:
        raise AddressRefused("url", "must be an https:// URL")
    if parts.username or parts.password:
        raise AddressRefused("url", "must not carry a user or password")
    rules = settings.WEBHOOKS
    plain = parts.scheme == "http"
    if plain and not (rules["ALLOW_LOOPBACK"] and _loopback_name(parts.hostname)):
        raise AddressRefused("url", PLAIN_REFUSED)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = _addresses(parts.hostname, port)
    loopback = all(a.is_loopback for a in addresses)
    if loopback and rules["ALLOW_LOOPBACK"]:
        return parts.hostname, addresses  # development: a receiver on this machine
    if plain:  # "localhost" that resolved elsewhere
        raise AddressRefused("url", PLAIN_REFUSED)
    private = [a for a in addresses if not address_public(a)]
    if private and not rules["ALLOW_PRIVATE"]:
        # The address is said only when the URL itself names it: what a name
        # resolved to would map the operator's own DNS for whoever asks.
        said = f" ({private[0]})" if _literal(parts.hostname) else ""
        raise AddressRefused(
            "url",
            f"resolves to a non-public address{said}; the operator may allow that with "
            "WEBHOOKS_ALLOW_PRIVATE",
        )
    return parts.hostname, addresses


# IPv6 forms that carry an IPv4 address a router or translator reaches:
# NAT64's well-known and local-use prefixes (RFC 6052, 8215).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def address_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether `address` is a public one, looking through the IPv6 forms
    that reach an IPv4 address (mapped, IPv4-compatible, NAT64, 6to4,
    Teredo): 64:ff9b::a00:1 is 10.0.0.1."""
    if not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour]
        embedded += [address.teredo[1] if address.teredo else None]
        if any(address in network for network in _NAT64) or int(address) >> 32 == 0:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(v4 is None or v4.is_global for v4 in embedded)
    return True
