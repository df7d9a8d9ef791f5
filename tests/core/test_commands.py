"""Bad input to a management command is refused in one line naming the
option (a CommandError: exit status 1, no traceback), and nothing is
written: dates that are no dates, a service's refusal (core.commands)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing.models import InvoiceRun
from serving.models import Pool
from tenants.models import ServiceKey, Tenant
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db

NOT_A_MOMENT = "is not a date or time (use ISO 8601 in UTC, e.g. 2026-10-05 or 2026-10-05T14:00)"


def _refused(*args) -> str:
    with pytest.raises(CommandError) as refused:
        call_command(*args, stdout=StringIO(), stderr=StringIO())
    message = str(refused.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize(
    "args",
    [
        ("invoice", "--as-of", "2026-02-30"),
        ("usage_days", "--since", "last week"),
        ("usage_days", "--until", "2026-10-05T25:00"),
    ],
)
def test_a_date_that_is_no_date_is_named_with_its_option(args):
    option, value = args[1], args[2]

    assert f"argument {option}: {value!r} {NOT_A_MOMENT}" in _refused(*args)
    assert not InvoiceRun.objects.exists()


def test_a_service_key_without_a_name_is_refused_and_none_is_made():
    assert _refused("service_key_create", "   ") == "name: must not be empty"
    assert not ServiceKey.objects.exists()


def test_an_unknown_pool_owner_is_refused_before_any_replica_starts():
    make_tenant(name="Alpha")  # a tenant, just not the one named

    message = _refused("vllm_up", "--pool-kind", "dedicated", "--owner", "nobody", "--pool", "p")

    assert message == "--owner: no tenant with slug 'nobody'"
    assert not Pool.objects.filter(name="p").exists()
    assert Tenant.objects.count() == 1


def test_negative_months_of_synthetic_history_are_refused_before_any_seed():
    assert _refused("synthetic_history", "--months", "-1") == "--months: must be 0 or more, not -1"
    assert not Tenant.objects.exists()
