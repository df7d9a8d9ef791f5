"""Password guessing is locked out with backoff (issue 60, finding 10),
attacked as a guesser would: wrong passwords on the sign-in page and on
the admin's. From the sixth failure the name is locked for a minute (a
429 with Retry-After on the site), the right password refused meanwhile;
the lock doubles with each further failure; it ends with time, and a
success clears the count. Another address guessing the same name is
locked too (the name's count), and one address guessing many names is
locked by its own."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery"


@pytest.fixture
def olga():
    user = UserFactory(username="olga")
    user.set_password(PASSWORD)
    user.save()
    return user


def _try(client, password: str, *, username: str = "olga", address: str = "198.51.100.7"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_guessing_a_password_is_locked_out_with_backoff(client, olga, pinned_clock):
    for _ in range(5):
        assert _try(client, "guess").status_code == 200  # refused, re-shown: free so far
    sixth = _try(client, "guess")
    assert sixth.status_code == 200  # the sixth failure locks the name
    locked = _try(client, PASSWORD)
    assert locked.status_code == 429 and 55 <= int(locked["Retry-After"]) <= 61
    assert "Too many failed sign-ins" in locked.content.decode()
    assert "_auth_user_id" not in client.session  # the right password, refused meanwhile
    assert _try(client, PASSWORD, address="203.0.113.9").status_code == 429  # the name's lock

    pinned_clock.shift(timedelta(seconds=61))
    assert _try(client, "guess").status_code == 200  # the seventh: locked twice as long
    assert 115 <= int(_try(client, PASSWORD)["Retry-After"]) <= 121
    pinned_clock.shift(timedelta(seconds=121))
    signed_in = _try(client, PASSWORD)
    assert signed_in.status_code == 302 and client.session["_auth_user_id"] == str(olga.pk)


def test_one_address_guessing_many_names_is_locked_by_its_own_count(client, olga):
    for n in range(6):
        _try(client, "guess", username=f"user{n}")
    assert _try(client, PASSWORD).status_code == 429  # olga, from that address


def test_the_admins_sign_in_is_locked_out_too(client, olga):
    olga.is_staff = True
    olga.save()
    for _ in range(6):
        client.post(
            "/admin/login/", {"username": "olga", "password": "guess"}, REMOTE_ADDR="198.51.100.7"
        )
    locked = client.post(
        "/admin/login/", {"username": "olga", "password": PASSWORD}, REMOTE_ADDR="198.51.100.7"
    )
    assert "Too many failed sign-ins" in locked.content.decode()
    assert "_auth_user_id" not in client.session
