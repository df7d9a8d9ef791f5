"""Single sign-on in a real browser, against a real OpenID Connect provider
(tests/oidc_provider.py): finance staff, a tenant's owner who sees only
their tenant, and a user whose claims map to no tenant, refused with
nothing created. The token and state checks: tests/tenants/test_sso.py."""

from __future__ import annotations

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tenants.choices import FINANCE_GROUP, Role
from tenants.models import Membership
from tests.factories import make_member, make_tenant
from tests.oidc_provider import oidc_provider_running, sso_settings

User = get_user_model()


@pytest.fixture
def provider(settings, transactional_db):
    with oidc_provider_running() as running:
        sso_settings(settings, running)
        yield running


def sso_sign_in(browser, live_server, provider, sub: str) -> None:
    """Our sign-in page, its provider button, the provider's own form."""
    browser.get(f"{live_server.url}/login/")
    browser.find_element(By.CSS_SELECTOR, "[data-testid=sso-sign-in]").click()
    WebDriverWait(browser, 10).until(ec.url_contains(f"{provider.url}/oauth2/authorize"))
    browser.find_element(By.NAME, "sub").send_keys(sub)
    browser.find_element(By.XPATH, "//button[text()='Authorize']").click()
    WebDriverWait(browser, 10).until(ec.url_contains(live_server.url))


def signed_in_as(browser) -> str:
    return (
        WebDriverWait(browser, 10)
        .until(ec.visibility_of_element_located((By.CSS_SELECTOR, "[data-testid=signed-in-as]")))
        .text
    )


def test_finance_staff_sign_in_with_their_identity_provider(browser, live_server, provider, shots):
    provider.user_set("fiona", email="fiona@operator.example", groups=["gpu-ledger-finance"])

    sso_sign_in(browser, live_server, provider, "fiona")

    assert signed_in_as(browser) == "fiona"
    browser.get(f"{live_server.url}/finance/")
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Finance")
    shots(browser, "finance")
    user = User.objects.get(email="fiona@operator.example")
    assert user.groups.filter(name=FINANCE_GROUP).exists()


def test_a_tenant_owner_signs_in_and_sees_only_their_tenant(browser, live_server, provider, shots):
    ours, theirs = make_tenant(name="Hooli"), make_tenant(name="Initech")
    make_member(ours, Role.OWNER)
    make_member(theirs, Role.OWNER)
    provider.user_set("olga", email="olga@hooli.example", tenant=ours.slug, role="owner")

    sso_sign_in(browser, live_server, provider, "olga")

    assert signed_in_as(browser) == "olga"
    badge = browser.find_element(By.CSS_SELECTOR, ".who .badge").text
    assert badge == "Hooli · owner"
    browser.get(f"{live_server.url}/keys/")
    assert "Hooli" in browser.page_source and "Initech" not in browser.page_source
    shots(browser, "keys")
    browser.get(f"{live_server.url}/finance/")
    assert browser.find_element(By.CSS_SELECTOR, "[data-testid=error-page]")
    user = User.objects.get(email="olga@hooli.example")
    assert list(Membership.objects.filter(user=user).values_list("tenant__slug", "role")) == [
        (ours.slug, Role.OWNER)
    ]


def test_a_user_whose_claims_map_to_no_tenant_is_refused(browser, live_server, provider, shots):
    make_tenant(name="Hooli")
    users = User.objects.count()
    provider.user_set("mallory", email="mallory@elsewhere.example", tenant="umbrella")

    sso_sign_in(browser, live_server, provider, "mallory")

    refusal = (
        WebDriverWait(browser, 10)
        .until(ec.visibility_of_element_located((By.CSS_SELECTOR, "[data-testid=sso-reason]")))
        .text
    )
    assert refusal == "no tenant here is named umbrella (claim 'tenant')"
    shots(browser, "refused")
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid=signed-in-as]")
    assert User.objects.count() == users
    assert not SocialAccount.objects.exists()
