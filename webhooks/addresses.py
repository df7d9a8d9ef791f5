"""Where an endpoint may point: https only (plain http to loopback in
development), and never at a private, link-local or otherwise non-public
address unless the operator allows it (WEBHOOKS_ALLOW_PRIVATE): a webhook
must not become a way into the operator's own network. Checked when an
endpoint is saved and again before every attempt (a name may resolve
elsewhere later)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

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
        return url  # development: a receiver on this machine, http or https
    if plain:  # "localhost" that resolved elsewhere
        raise AddressRefused("url", PLAIN_REFUSED)
    private = [a for a in addresses if not a.is_global]
    if private and not rules["ALLOW_PRIVATE"]:
        raise AddressRefused(
            "url",
            f"resolves to a non-public address ({private[0]}); the operator may allow "
            "that with WEBHOOKS_ALLOW_PRIVATE",
        )
    return url
