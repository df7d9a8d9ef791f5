"""tenants.services beyond what the API tests cover."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from tenants.choices import Role
from tenants.errors import AuthenticationError, LastOwnerError
from tenants.models import ApiKey, Membership, TenantPolicy
from tenants.services import api_key_authenticate, membership_remove, membership_set
from tests.conftest import client_for_key
from tests.factories import UserFactory, make_tenant

pytestmark = pytest.mark.django_db


def test_tenant_create_gives_a_default_policy():
    tenant = make_tenant(tier="dedicated")
    assert tenant.policy.priority_class == "normal"
    assert tenant.policy.budget_soft_percent == 80
    assert tenant.policy.budget_hard_percent == 100


def test_fair_queuing_policy_defaults_and_bounds(world_a):
    policy = make_tenant().policy
    assert (policy.fair_share_weight, policy.queue_timeout_ms, policy.max_queued_requests) == (
        1,
        5000,
        100,
    )
    for field, bad in [
        ("fair_share_weight", 0),
        ("queue_timeout_ms", 600_001),
        ("max_queued_requests", 10_001),
    ]:
        with pytest.raises(ValidationError) as refused:
            make_tenant(policy={field: bad})
        assert field in refused.value.message_dict
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantPolicy.objects.filter(pk=policy.pk).update(fair_share_weight=0)
    # The tenant sees its own queue policy, and only its own.
    body = client_for_key(world_a.secret).get("/api/v1/tenants/me").json()
    assert body["tenant"]["policy"]["queue_timeout_ms"] == 5000
    assert body["tenant"]["policy"]["fair_share_weight"] == 1
    assert body["tenant"]["policy"]["max_queued_requests"] == 100


def test_a_tenant_keeps_at_least_one_owner():
    tenant = make_tenant()
    owner = membership_set(tenant=tenant, user=UserFactory(), role=Role.OWNER)
    with pytest.raises(LastOwnerError):
        membership_set(tenant=tenant, user=owner.user, role=Role.VIEWER)
    with pytest.raises(LastOwnerError):
        membership_remove(tenant=tenant, user=owner.user)
    second = membership_set(tenant=tenant, user=UserFactory(), role=Role.OWNER)
    membership_remove(tenant=tenant, user=owner.user)
    assert list(Membership.objects.filter(tenant=tenant)) == [second]


@pytest.mark.parametrize(
    "raw",
    ["", "glk_", "sk-1234", "glk_short_secret", "glk_" + "a" * 10 + "_" + "!" * 43],
)
def test_malformed_keys_are_refused_without_a_lookup(raw, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(AuthenticationError, match="malformed"):
        api_key_authenticate(raw_key=raw)


def test_unknown_prefix_is_invalid():
    with pytest.raises(AuthenticationError, match="invalid"):
        api_key_authenticate(raw_key="glk_" + "A" * 10 + "_" + "b" * 43)
    assert not ApiKey.objects.exists()


def test_keys_marked_used_in_one_statement_never_move_back(django_assert_num_queries):
    from datetime import UTC, datetime

    from tenants.services import api_keys_mark_used
    from tests.factories import make_key

    tenant = make_tenant()
    keys = [make_key(tenant, name=f"k{n}")[0] for n in range(3)]
    early, late = datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 2, tzinfo=UTC)
    ApiKey.objects.filter(pk=keys[0].pk).update(last_used_at=late)
    with django_assert_num_queries(1):
        updated = api_keys_mark_used(used_at_by_key={k.pk: early for k in keys})
    assert updated == 2  # the first key's later use is kept
    stamps = dict(ApiKey.objects.filter(tenant=tenant).values_list("pk", "last_used_at"))
    assert stamps == {keys[0].pk: late, keys[1].pk: early, keys[2].pk: early}
    assert api_keys_mark_used(used_at_by_key={}) == 0
