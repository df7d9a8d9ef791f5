"""tenants.services beyond what the API tests cover."""

import pytest

from tenants.choices import Role
from tenants.errors import AuthenticationError, LastOwnerError
from tenants.models import ApiKey, Membership
from tenants.services import api_key_authenticate, membership_remove, membership_set
from tests.factories import UserFactory, make_tenant

pytestmark = pytest.mark.django_db


def test_tenant_create_gives_a_default_policy():
    tenant = make_tenant(tier="dedicated")
    assert tenant.policy.priority_class == "normal"
    assert tenant.policy.budget_soft_percent == 80
    assert tenant.policy.budget_hard_percent == 100


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
