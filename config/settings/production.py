"""Production: secrets and external services are required, not defaulted.
A required setting that is unset, empty or a development default ends the
process at start with one line naming it (base.configuration_error)."""

from config.settings.base import *  # noqa: F403
from config.settings.base import (
    BASE_DIR,
    DATABASE_URL_FORM,
    DEV_SECRET_KEY,
    configuration_error,
    env,
)

_problems: list[str] = []  # every one of them in the one line, not one per restart


def _required(name: str, *, form: str, secret: bool = False) -> str:
    """A setting production must be given: never empty and, for a secret,
    never the development default that every clone of the repository knows."""
    value = env.str(name, default="")
    if not value.strip():
        _problems.append(f"{name} is required ({form})")
    elif secret and value in {DEV_SECRET_KEY, "change-me"}:  # base.py's, .env.example's
        _problems.append(f"{name} is the development default: set a secret of your own")
    return value


SECRET_KEY = _required("DJANGO_SECRET_KEY", form="a long random string", secret=True)
# base.py falls back to an embedded server in a local folder: never in production.
_required("DATABASE_URL", form=DATABASE_URL_FORM)
# The HMAC pepper of stored API keys, a secret of its own with no fallback to
# the secret key: that key can then be rotated without invalidating every API
# key. (A deployment that relied on the old fallback sets it to its secret key.)
API_KEY_PEPPER = _required(
    "API_KEY_PEPPER", form="a long random string, kept as long as the API keys", secret=True
)
if _problems:
    configuration_error("; ".join(_problems))

DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# No SECURE_PROXY_SSL_HEADER: Django would believe X-Forwarded-Proto from any
# caller. The web server (manage.py web) takes the scheme from it only when
# the connection comes from WEB_TRUSTED_PROXIES (config.proxies).
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
# Probes and Prometheus call the container over plain HTTP from inside its
# network (a compose healthcheck, a kubelet): never redirected to HTTPS.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=60 * 60 * 24 * 30)
# Every subdomain too: a sibling served over plain HTTP could set cookies for this one.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
# The test client's host name is the development default's, never production's.
ALLOWED_HOSTS = [host for host in ALLOWED_HOSTS if host != "testserver"]  # noqa: F405
SECURE_CONTENT_TYPE_NOSNIFF = True
STATIC_ROOT = env("DJANGO_STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
