"""Sign-in lock-out with backoff (issue 60, finding 10): password guessing
against the sign-in page or the admin is slowed to nothing. Failures are
counted per account name and per client address; from the fifth in a
quarter of an hour, that name (or address) is locked out for a minute,
doubling with each further failure up to an hour. A success clears the
name's count. Counts live in Django's cache (Redis when REDIS_URL is set,
so every web process shares them; else each process's own memory)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache

FREE_FAILURES = 5  # before any lock-out
WINDOW_SECONDS = 15 * 60  # a failure is forgotten after this long without another
FIRST_LOCK_SECONDS = 60
MAX_LOCK_SECONDS = 60 * 60


@dataclass(frozen=True)
class Locked:
    seconds: int  # until the next try is taken


def _keys(username: str, address: str) -> list[str]:
    return [f"sign-in:name:{username.strip().lower()}", f"sign-in:addr:{address}"]


def sign_in_locked(*, username: str, address: str) -> Locked | None:
    """Whether a try for `username` from `address` must wait, and how long."""
    now = time.time()
    waits = [
        until - now for key in _keys(username, address) for _, until in [_read(key)] if until > now
    ]
    return Locked(seconds=int(max(waits)) + 1) if waits else None


def sign_in_failed(*, username: str, address: str) -> None:
    now = time.time()
    for key in _keys(username, address):
        failures, _ = _read(key)
        failures += 1
        over = failures - FREE_FAILURES
        until = now + min(MAX_LOCK_SECONDS, FIRST_LOCK_SECONDS * 2 ** (over - 1)) if over > 0 else 0
        cache.set(key, (failures, until), timeout=WINDOW_SECONDS + MAX_LOCK_SECONDS)


def sign_in_succeeded(*, username: str) -> None:
    cache.delete(_keys(username, "")[0])


def _read(key: str) -> tuple[int, float]:
    return cache.get(key) or (0, 0.0)


def client_address(request) -> str:
    return request.META.get("REMOTE_ADDR", "") if request is not None else ""


class LockingFormMixin:
    """An authentication form that refuses a locked-out name or address
    before checking the password, and counts each failure."""

    locked: Locked | None = None

    def clean(self):
        username = self.data.get("username", "") or ""
        address = client_address(self.request)
        self.locked = sign_in_locked(username=username, address=address)
        if self.locked is not None:
            raise forms.ValidationError(
                f"Too many failed sign-ins: try again in {self.locked.seconds} s.",
                code="locked_out",
            )
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            sign_in_failed(username=username, address=address)
            raise
        sign_in_succeeded(username=username)
        return cleaned


class LockingAuthenticationForm(LockingFormMixin, AuthenticationForm):
    pass


class LockingAdminAuthenticationForm(LockingFormMixin, AdminAuthenticationForm):
    pass
