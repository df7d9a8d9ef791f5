"""The format and hashing of API key secrets (no database access here).

A key reads `glk_<prefix>_<secret>`: a 10-character public prefix that finds
the row, and a 43-character secret (about 256 bits) that proves possession.
Only HMAC-SHA256(pepper, key) is stored. A slow password hash would add
nothing against a 256-bit secret and would cost every gateway request.
"""

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass

from django.conf import settings

KEY_PREFIX = "glk_"  # a tenant's API key
SERVICE_KEY_PREFIX = "gls_"  # a platform service key (usage ingestion)
_ALPHABET = string.ascii_letters + string.digits
PREFIX_LENGTH = 10
SECRET_LENGTH = 43
KEY_MAX_CHARS = len(KEY_PREFIX) + PREFIX_LENGTH + 1 + SECRET_LENGTH  # what is longer is no key


@dataclass(frozen=True)
class ParsedKey:
    prefix: str
    raw: str


def key_generate(kind: str = KEY_PREFIX) -> tuple[str, str]:
    """A new (prefix, full key) of `kind` (KEY_PREFIX or SERVICE_KEY_PREFIX)."""
    prefix = "".join(secrets.choice(_ALPHABET) for _ in range(PREFIX_LENGTH))
    secret = "".join(secrets.choice(_ALPHABET) for _ in range(SECRET_LENGTH))
    return prefix, f"{kind}{prefix}_{secret}"


def key_parse(raw: str, kind: str = KEY_PREFIX) -> ParsedKey | None:
    """The key's parts, or None when it is not shaped like one of `kind`."""
    if not raw.startswith(kind):
        return None
    body = raw[len(kind) :]
    prefix, sep, secret = body.partition("_")
    if (
        not sep
        or len(prefix) != PREFIX_LENGTH
        or len(secret) != SECRET_LENGTH
        or not all(c in _ALPHABET for c in prefix + secret)
    ):
        return None
    return ParsedKey(prefix=prefix, raw=raw)


def key_hash(raw: str) -> str:
    pepper = settings.API_KEY_PEPPER.encode()
    return hmac.new(pepper, raw.encode(), hashlib.sha256).hexdigest()


def key_hash_matches(raw: str, stored_hash: str) -> bool:
    return hmac.compare_digest(key_hash(raw), stored_hash)
