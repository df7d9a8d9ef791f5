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
    connects there (pinned_transport) and never asks the name again, so a
    name that resolves to a public address for the check and to a private
    one for the connection (DNS rebinding) reaches nothing it should not."""
    host, addresses = _checked(url)
    return host, str(addresses[0])


class _PinnedBackend(httpcore.SyncBackend):
    def __init__(self, host: str, address: str) -> None:
        self.host, self.address = host, address

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return super().connect_tcp(
            self.address if host == self.host else host,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )


def pinned_transport(host: str, address: str) -> httpx.HTTPTransport:
    """A transport that connects `host` to `address` (TLS still verifies
    the certificate against `host`). An egress proxy from the environment
    (HTTPS_PROXY), where the operator sets one, is used instead: the proxy
    then resolves, as the operator's egress control."""
    context = _ssl_context()
    transport = httpx.HTTPTransport(verify=context)
    transport._pool = httpcore.ConnectionPool(  # httpx offers no resolver hook
        ssl_context=context, network_backend=_PinnedBackend(host, address)
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
    private = [a for a in addresses if not a.is_global]
    if private and not rules["ALLOW_PRIVATE"]:
        raise AddressRefused(
            "url",
            f"resolves to a non-public address ({private[0]}); the operator may allow "
            "that with WEBHOOKS_ALLOW_PRIVATE",
        )
    return parts.hostname, addresses
