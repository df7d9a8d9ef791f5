"""Development on one machine (`./dev up`, `manage.py`): the base settings
as they are, embedded PostgreSQL and a folder broker when DATABASE_URL and
REDIS_URL are unset, development secrets allowed."""

from config.settings.base import *  # noqa: F403

# Webhook receivers on this machine (plain http) are allowed here only.
WEBHOOKS = {**WEBHOOKS, "ALLOW_LOOPBACK": True}  # noqa: F405
