"""Production: secrets and external services are required, not defaulted."""

import environ

from config.settings.base import *  # noqa: F403
from config.settings.base import BASE_DIR, DEV_SECRET_KEY, env


def _secret(name: str, value: str) -> str:
    """A secret production must be given: never empty, never the
    development default that every clone of the repository knows."""
    if not value or value in {DEV_SECRET_KEY, "change-me"}:  # base.py's, .env.example's
        raise environ.ImproperlyConfigured(
            f"{name} is unset or the development default: set a secret of your own"
        )
    return value


SECRET_KEY = _secret("DJANGO_SECRET_KEY", env("DJANGO_SECRET_KEY", default=""))
# The HMAC pepper of stored API keys: its own secret, else the secret key
# (base.py would have derived it from the development key).
API_KEY_PEPPER = _secret("API_KEY_PEPPER", env("API_KEY_PEPPER", default="") or SECRET_KEY)
DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=60 * 60 * 24 * 30)
SECURE_CONTENT_TYPE_NOSNIFF = True
STATIC_ROOT = env("DJANGO_STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
