"""Single sign-on through a real OpenID Connect provider (tests/oidc_provider.py):
the dashboard's sign-in button, the provider's authorization form, the
callback with its code and state, the token exchange and ID token checks.
Django answers through its test client; the provider is a real HTTP server.
The pages in a real browser: tests/browser/test_sso.py."""

from __future__ import annotations

import logging
from datetime import timedelta
from html import unescape
from urllib.parse import urlsplit

import httpx
import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.test import Client

from audit.models import AuditEntry
from tenants.choices import FINANCE_GROUP, Role
from tenants.models import Membership
from tests.factories import make_tenant
from tests.oidc_provider import oidc_provider_running, sso_settings, sso_settings_entries

pytestmark = pytest.mark.django_db
User = get_user_model()
CALLBACK = "GET /accounts/oidc/corp/login/callback/"


@pytest.fixture
def provider(settings):
    with oidc_provider_running() as running:
        sso_settings(settings, running)
        yield running


def sso_sign_in(client: Client, sub: str, *, state: str | None = None, provider_id="corp"):
    """Press "Sign in with Corp SSO" (or another provider's button),
    authorize `sub` on the provider's form, and follow its redirect back
    (with `state` in place of the real one, if given). Django's answer to
    the callback."""
    started = client.post(f"/accounts/oidc/{provider_id}/login/", {"next": ""})
    assert started.status_code == 302, started.content
    authorize = started["Location"]
    assert "/oauth2/authorize?" in authorize
    answer = httpx.post(authorize, data={"sub": sub})
    assert answer.status_code == 302, answer.text
    callback = urlsplit(answer.headers["location"])
    assert callback.path == f"/accounts/oidc/{provider_id}/login/callback/"
    query = callback.query
    if state is not None:
        query = "&".join(
            f"state={state}" if part.startswith("state=") else part for part in query.split("&")
        )
    return client.get(f"{callback.path}?{query}")


def test_the_sign_in_page_offers_each_configured_provider(client, provider):
    page = client.get("/login/")
    assert b"Sign in with Corp SSO" in page.content
    assert b'action="/accounts/oidc/corp/login/"' in page.content
    assert b'name="password"' in page.content  # password sign-in stays on unless turned off


def test_two_providers_each_with_its_own_claim_names(client, settings, world_a, world_b):
    """The operator's staff through one provider, a partner's through
    another whose claims are named otherwise; the same subject at two
    providers is two people."""
    with oidc_provider_running() as corp, oidc_provider_running() as partner:
        sso_settings_entries(
            settings,
            [
                corp.settings_entry(),
                partner.settings_entry(
                    provider_id="partner",
                    name="Partner IdP",
                    finance_groups=[],
                    tenant_claim="org",
                    role_claim="org_role",
                ),
            ],
        )
        page = client.get("/login/").content
        assert b"Sign in with Corp SSO" in page and b"Sign in with Partner IdP" in page
        corp.user_set("kim", email="kim@operator.example", groups=["gpu-ledger-finance"])
        partner.user_set(
            "kim", email="kim@b.example", org=world_b.tenant.slug, org_role="admin",
            groups=["gpu-ledger-finance"],  # not a finance group at this provider
        )  # fmt: skip

        assert sso_sign_in(client, "kim").status_code == 302
        client.logout()
        assert sso_sign_in(client, "kim", provider_id="partner").status_code == 302

    staff = SocialAccount.objects.get(provider="corp", uid="kim").user
    member = SocialAccount.objects.get(provider="partner", uid="kim").user
    assert staff != member
    assert staff.groups.filter(name=FINANCE_GROUP).exists()
    assert not member.groups.exists()
    assert list(Membership.objects.filter(user=member).values_list("tenant__slug", "role")) == [
        (world_b.tenant.slug, Role.ADMIN)
    ]
    assert client.get("/finance/").status_code == 403  # signed in as the partner's kim


def test_finance_staff_sign_in_by_their_group_claim(client, provider):
    provider.user_set("fiona", email="fiona@operator.example", groups=["gpu-ledger-finance"])

    answer = sso_sign_in(client, "fiona")

    assert answer.status_code == 302 and answer["Location"] == "/"
    user = User.objects.get(email="fiona@operator.example")
    assert list(user.groups.values_list("name", flat=True)) == [FINANCE_GROUP]
    assert not Membership.objects.filter(user=user).exists()
    assert SocialAccount.objects.get(user=user).uid == "fiona"
    assert client.get("/finance/").status_code == 200


def test_a_tenant_owner_becomes_a_member_with_the_role_the_claims_say(
    client, provider, world_a, world_b
):
    slug = world_a.tenant.slug
    provider.user_set("olga", email="olga@a.example", tenant=slug, role="owner")

    assert sso_sign_in(client, "olga").status_code == 302

    user = User.objects.get(email="olga@a.example")
    assert list(Membership.objects.filter(user=user).values_list("tenant__slug", "role")) == [
        (slug, Role.OWNER)
    ]
    assert not user.groups.exists()
    assert client.get("/finance/").status_code == 403
    keys = client.get("/keys/")
    assert world_a.tenant.name.encode() in keys.content
    assert world_b.tenant.name.encode() not in keys.content


def test_each_sign_in_makes_the_user_what_the_provider_now_says(
    client, provider, world_a, world_b, caplog
):
    provider.user_set(
        "sam",
        email="sam@a.example",
        tenant=world_a.tenant.slug,
        role="admin",
        groups=["gpu-ledger-finance"],
    )
    sso_sign_in(client, "sam")
    user = User.objects.get(email="sam@a.example")
    assert user.groups.filter(name=FINANCE_GROUP).exists()
    client.logout()

    provider.user_set("sam", email="sam@a.example", tenant=[world_b.tenant.slug], role="viewer")
    assert sso_sign_in(client, "sam").status_code == 302

    assert User.objects.filter(email="sam@a.example").count() == 1
    assert list(Membership.objects.filter(user=user).values_list("tenant__slug", "role")) == [
        (world_b.tenant.slug, Role.VIEWER)
    ]
    assert not user.groups.exists()

    # The audit trail names the provider's subject on the user's behalf, on
    # the first sign-in (the user made) and the next (their standing moved).
    # Made finance staff at the first sign-in, no longer at the second.
    groups = AuditEntry.objects.filter(table="auth_user_groups").order_by("id")
    assert [(e.action, e.actor, e.via) for e in groups] == [
        ("insert", "sso:corp:sam", "sso"),
        ("delete", "sso:corp:sam", "sso"),
    ]
    [made] = AuditEntry.objects.filter(table="auth_user", action="insert", row_id=str(user.pk))
    assert (made.actor, made.actor_user_id, made.via) == ("sso:corp:sam", None, "sso")
    assert made.after["email"] == "sam@a.example" and "password" not in made.after
    entries = AuditEntry.objects.filter(table="tenants_membership").order_by("id")
    assert [
        (e.action, e.after and e.after["role"], e.actor, e.actor_user_id, e.via, e.request)
        for e in entries
        if (e.after or e.before)["user_id"] == user.pk
    ] == [
        ("insert", "admin", "sso:corp:sam", user.pk, "sso", CALLBACK),
        ("insert", "viewer", "sso:corp:sam", user.pk, "sso", CALLBACK),
        ("delete", None, "sso:corp:sam", user.pk, "sso", CALLBACK),
    ]


def test_the_last_owner_of_a_tenant_stays_its_owner(client, provider, caplog):
    tenant = make_tenant(name="Solo")
    provider.user_set("solo", email="solo@s.example", tenant=tenant.slug, role="owner")
    sso_sign_in(client, "solo")
    client.logout()
    provider.user_set("solo", email="solo@s.example", tenant=tenant.slug, role="viewer")

    with caplog.at_level(logging.WARNING, logger="tenants.sso"):
        assert sso_sign_in(client, "solo").status_code == 302

    assert Membership.objects.get(tenant=tenant).role == Role.OWNER
    assert f"kept as the last owner of {tenant.slug} (the provider says viewer)" in caplog.text


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"tenant": "nope"}, "no tenant here is named nope (claim 'tenant')"),
        ({}, "named no tenant (claim 'tenant') and no finance group (claim 'groups')"),
        ({"groups": ["engineering"]}, "named no tenant"),
        ({"tenant": "{slug}", "role": "root"}, "claim 'role' is 'root'; it must be one of"),
    ],
)
def test_claims_that_map_to_nothing_are_refused_and_nothing_is_created(
    client, provider, claims, reason, caplog
):
    slug = make_tenant().slug
    claims = {k: v.replace("{slug}", slug) for k, v in claims.items() if isinstance(v, str)} | {
        k: v for k, v in claims.items() if not isinstance(v, str)
    }
    users_before = User.objects.count()
    provider.user_set("nobody", email="nobody@x.example", **claims)

    with caplog.at_level(logging.WARNING, logger="tenants.sso"):
        answer = sso_sign_in(client, "nobody")

    assert answer.status_code == 403
    assert reason in unescape(answer.content.decode())
    assert "Nothing was created for you here" in answer.content.decode()
    assert User.objects.count() == users_before
    assert not SocialAccount.objects.exists()
    assert "_auth_user_id" not in client.session
    assert "single sign-on refused for corp:nobody: " in caplog.text and reason in caplog.text


def _refused(client, answer, caplog, reason: str) -> None:
    assert answer.status_code == 400
    assert reason in unescape(answer.content.decode())
    assert not User.objects.filter(email="eve@x.example").exists()
    assert not SocialAccount.objects.exists()
    assert "_auth_user_id" not in client.session
    assert any(
        r.name == "tenants.sso"
        and "single sign-on failed with provider corp" in r.getMessage()
        and reason in r.getMessage()
        for r in caplog.records
    ), caplog.text


def test_an_id_token_for_another_audience_is_refused(client, settings, caplog):
    with oidc_provider_running(audience="someone-elses-app") as other:
        sso_settings(settings, other)
        other.user_set("eve", email="eve@x.example", groups=["gpu-ledger-finance"])
        with caplog.at_level(logging.WARNING, logger="tenants.sso"):
            answer = sso_sign_in(client, "eve")
    _refused(client, answer, caplog, "the ID token is for another audience")


def test_an_expired_id_token_is_refused(client, settings, caplog):
    # Claims from the ID token alone: the provider's userinfo would refuse
    # the (as expired) access token first.
    with oidc_provider_running(token_lifetime=timedelta(seconds=-60)) as stale:
        sso_settings(settings, stale, userinfo=False)
        stale.user_set("eve", email="eve@x.example", groups=["gpu-ledger-finance"])
        with caplog.at_level(logging.WARNING, logger="tenants.sso"):
            answer = sso_sign_in(client, "eve")
    _refused(client, answer, caplog, "the ID token has expired")


def test_a_state_that_this_session_did_not_start_is_refused(client, provider, caplog):
    provider.user_set("eve", email="eve@x.example", groups=["gpu-ledger-finance"])
    with caplog.at_level(logging.WARNING, logger="tenants.sso"):
        answer = sso_sign_in(client, "eve", state="forged-state")
    _refused(
        client, answer, caplog, "state mismatch: no sign-in was started with state 'forged-state'"
    )


def test_with_password_sign_in_off_no_password_signs_anyone_in(client, provider, settings):
    settings.PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = ["tenants.sso.backends.NoPasswordBackend"]
    User.objects.create_user("pat", password="a-good-password-1")

    page = client.get("/login/")
    assert b'name="password"' not in page.content and b"Sign in with Corp SSO" in page.content
    refused = client.post("/login/", {"username": "pat", "password": "a-good-password-1"})
    assert refused.status_code == 403
    assert "_auth_user_id" not in client.session
    admin = client.post(
        "/admin/login/", {"username": "pat", "password": "a-good-password-1", "next": "/admin/"}
    )
    assert admin.status_code == 200 and "_auth_user_id" not in client.session

    provider.user_set("pat-sso", email="pat@operator.example", groups=["gpu-ledger-finance"])
    assert sso_sign_in(client, "pat-sso").status_code == 302
    assert client.get("/finance/").status_code == 200


def test_a_provider_grants_only_the_tenants_the_operator_lists_for_it(
    client, settings, world_a, world_b, caplog
):
    """Issue 60, finding 9: a partner's provider listed for tenant A names
    its user owner of A and of B; the user becomes A's member only, B's
    grant is refused and named in the log; naming only B is refused."""
    with oidc_provider_running() as partner:
        sso_settings_entries(
            settings, [partner.settings_entry(finance_groups=[], tenants=[world_a.tenant.slug])]
        )
        partner.user_set(
            "pat", email="pat@a.example", tenant=[world_a.tenant.slug, world_b.tenant.slug],
            role="owner",
        )  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="tenants.sso"):
            assert sso_sign_in(client, "pat").status_code == 302
        client.logout()
        partner.user_set("eve", email="eve@b.example", tenant=world_b.tenant.slug, role="owner")
        refused = sso_sign_in(client, "eve")

    pat = User.objects.get(email="pat@a.example")
    assert list(Membership.objects.filter(user=pat).values_list("tenant__slug", flat=True)) == [
        world_a.tenant.slug
    ]
    assert f"may not grant {world_b.tenant.slug}; left out" in caplog.text
    assert refused.status_code == 403
    assert f"may not grant access to {world_b.tenant.slug}" in refused.content.decode()
    assert not User.objects.filter(email="eve@b.example").exists()


def test_a_provider_saying_not_finance_revokes_every_finance_grant(client, provider, world_a):
    """Issue 60, finding 6: finance_staff granted directly in the admin,
    and through a group of the operator's making, survived a sign-in whose
    claims say "not finance". Both grants are in the audit trail."""
    from django.contrib.auth.models import Group, Permission

    from tenants.selectors import user_is_finance_staff

    provider.user_set("max", email="max@a.example", tenant=world_a.tenant.slug, role="viewer")
    assert sso_sign_in(client, "max").status_code == 302
    client.logout()
    max_ = User.objects.get(email="max@a.example")
    finance = Permission.objects.get(codename="finance_staff")
    auditors = Group.objects.create(name="Auditors")
    auditors.permissions.add(finance)
    max_.user_permissions.add(finance)
    max_.groups.add(auditors)
    assert user_is_finance_staff(user=User.objects.get(pk=max_.pk))
    assert AuditEntry.objects.filter(table="auth_user_user_permissions", action="insert").exists()
    assert AuditEntry.objects.filter(table="auth_group_permissions", action="insert").exists()

    assert sso_sign_in(client, "max").status_code == 302
    assert not user_is_finance_staff(user=User.objects.get(pk=max_.pk))
    assert client.get("/finance/").status_code == 403
    assert AuditEntry.objects.filter(table="auth_user_user_permissions", action="delete").exists()
