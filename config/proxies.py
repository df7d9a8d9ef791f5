"""The proxies whose X-Forwarded-Proto and X-Forwarded-For the web app
believes (WEB_TRUSTED_PROXIES): the TLS proxy in front of it. A request
from anywhere else is taken as it came: its scheme is the connection's,
its address the peer's, whatever headers it sends. So a caller cannot
claim HTTPS (and be handed secure cookies over plain HTTP, or pass the
redirect to HTTPS), nor another address (and dodge the sign-in limits).

Nothing here imports an app: settings load before apps do."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import NoReturn


def trusted_proxies_parse(
    entries: Iterable[str], *, problem: Callable[[str], NoReturn]
) -> list[str]:
    """Each entry an address or a network (CIDR), as uvicorn's
    forwarded_allow_ips takes them; `problem` is called naming the setting
    and the first entry that is neither. "*" (every caller) is refused:
    name the proxies' network instead."""
    kept = []
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        if entry == "*":
            problem(
                "WEB_TRUSTED_PROXIES must name the proxies in front of the web app "
                "(addresses or networks, e.g. 10.42.0.0/16), not '*': every caller "
                "could then claim HTTPS and any address"
            )
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            problem(
                f"WEB_TRUSTED_PROXIES: {entry!r} is not an IP address or network "
                "(a comma-separated list, e.g. 127.0.0.1,10.42.0.0/16)"
            )
        kept.append(entry)
    return kept
