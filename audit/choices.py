"""Enumerations of the audit trail."""

from django.db import models


class Action(models.TextChoices):
    INSERT = "insert", "Created"
    UPDATE = "update", "Changed"
    DELETE = "delete", "Deleted"
    TRUNCATE = "truncate", "Emptied (every row at once)"
    SCHEMA = "schema", "Schema changed"


class Via(models.TextChoices):
    """Where a change came from."""

    SESSION = "session", "Dashboard (signed in)"
    ADMIN = "admin", "Admin"
    SSO = "sso", "Single sign-on (the identity provider's claims)"
    API_KEY = "api_key", "API key"
    JOB = "job", "Scheduled or queued job"
    COMMAND = "command", "Management command"
    DATABASE = "database", "Database session (outside the application)"
