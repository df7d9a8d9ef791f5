"""Settings for the test suite: the same PostgreSQL and broker rules as
everywhere else, plus fast password hashing and captured email."""

from config.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEBUG = False

# Webhook receivers on this machine (plain http) are allowed here only.
WEBHOOKS = {**WEBHOOKS, "ALLOW_LOOPBACK": True}  # noqa: F405

# Each test process its own cache (sign-in lock-outs), emptied before each test
# (tests/conftest.py): never shared through Redis with another test.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
