"""Settings for the test suite: the same PostgreSQL and broker rules as
everywhere else, plus fast password hashing and captured email."""

from config.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEBUG = False

# Webhook receivers on this machine (plain http) are allowed here only.
WEBHOOKS = {**WEBHOOKS, "ALLOW_LOOPBACK": True}  # noqa: F405
