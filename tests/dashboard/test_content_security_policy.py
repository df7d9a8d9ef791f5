"""Every page carries a Content-Security-Policy (issue 60, item 10) whose
script-src allows only this site's files and the request's own nonce: every
script and <style> element a finance user's or a tenant owner's page holds
carries that nonce, no element has an inline event handler or a style
attribute (no nonce can allow those), each request gets a fresh nonce, and
a <script> slipped into a page without it is refused (no 'unsafe-inline')."""

from __future__ import annotations

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.utils import timezone

from billing.choices import ReportKind
from billing.reports.margin_reports import margin_report_build, margin_report_request
from metering.models import UsageRollup
from tenants.choices import Role
from tests.billing.conftest import NOV, OCT
from tests.factories import make_finance_user, make_member

FINANCE_PAGES = [
    "/",
    "/finance/",
    "/finance/tenants/{slug}/",
    "/finance/models/tiny/",
    "/finance/receivables/",
    "/finance/slo/",
    "/finance/tax/",
    "/finance/prices/",
    "/finance/tenants/{slug}/terms/",
    "/finance/plan/",
    "/finance/archives/",
    "/costs/",
    "/fleet/",
    "/reconciliation/",
    "/jobs/",
    "/audit/",
    "/webhooks/",
    "/invoices/",
    "/invoices/{invoice}/",
    "/invoices/{draft}/",
]
OWNER_PAGES = [
    "/",
    "/usage/",
    "/keys/",
    "/invoices/",
    "/invoices/{invoice}/",
    "/webhooks/",
    "/audit/",
]
# Data blocks (json_script): the browser never runs them, so no policy applies.
DATA_TYPES = {"application/json"}


class Elements(HTMLParser):
    """The page's script and style elements, and every inline event handler
    or style attribute on any element."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict] = []
        self.styles: list[dict] = []
        self.inline_attributes: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script":
            self.scripts.append(attributes)
        elif tag == "style":
            self.styles.append(attributes)
        self.inline_attributes += [
            (tag, name) for name, _ in attrs if name.startswith("on") or name == "style"
        ]


def _policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {
        directive.split()[0]: directive.split()[1:]
        for directive in (part.strip() for part in header.split(";"))
        if directive
    }


def _nonce(policy: dict[str, list[str]]) -> str:
    (nonce,) = [s[len("'nonce-") : -1] for s in policy["script-src"] if s.startswith("'nonce-")]
    return nonce


@pytest.fixture
def populated(world, issued):
    """Pages with what makes them draw: a margin report (the overview's
    charts and its table built in the browser), an allocated pool (the
    cost bars), a tenant's usage this month (its chart and spend)."""
    pool = world.pool("shared")
    replica = world.replica("r0", pool, [world.gpu("g0")])
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    world.use(world.a, replica, 1800, hour=hour, completion=1000)
    world.allocate(start=hour)
    report = margin_report_request(kind=ReportKind.CLOSE, start=OCT, end=NOV)
    margin_report_build(report_id=report.pk)
    assert UsageRollup.objects.filter(tenant=world.a).exists()
    return {
        "slug": world.a.slug,
        "invoice": issued[world.a.slug].pk,
        "draft": issued["draft"].pk,
        "finance": make_finance_user(),
        "owner": make_member(world.a, Role.OWNER).user,
    }


@pytest.mark.parametrize(("who", "pages"), [("finance", FINANCE_PAGES), ("owner", OWNER_PAGES)])
def test_every_page_runs_only_the_scripts_and_styles_carrying_its_nonce(
    client, populated, who, pages
):
    client.force_login(populated[who])
    inline_scripts = 0
    for path in pages:
        response = client.get(path.format(**populated))
        assert response.status_code == 200, path
        policy = _policy(response)
        nonce = _nonce(policy)
        assert len(nonce) >= 16, path
        assert policy["style-src"] == ["'self'", f"'nonce-{nonce}'"], path
        page = Elements()
        page.feed(response.content.decode())
        runnable = [s for s in page.scripts if s.get("type") not in DATA_TYPES]
        assert [s.get("nonce") for s in runnable + page.styles] == [nonce] * len(
            runnable + page.styles
        ), path
        assert page.inline_attributes == [], path
        inline_scripts += sum(1 for s in runnable if "src" not in s)
    assert inline_scripts > 0  # the pages' own scripts were among those checked


def test_two_requests_get_different_nonces(client, populated):
    client.force_login(populated["finance"])
    first, second = client.get("/finance/"), client.get("/finance/")
    assert _nonce(_policy(first)) != _nonce(_policy(second))
    nonce = _nonce(_policy(first))
    assert f'nonce="{nonce}"' in first.content.decode()
    assert nonce not in second.content.decode()


def test_a_script_without_the_nonce_is_refused(client, world_a):
    policy = _policy(client.get("/login/"))
    assert policy["default-src"] == ["'self'"]
    for directive in ("script-src", "style-src"):
        sources = policy[directive]
        assert "'unsafe-inline'" not in sources and "'unsafe-eval'" not in sources
        assert "*" not in sources and not any(s.endswith(":") for s in sources), sources
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["form-action"] == ["'self'"]
    assert policy["img-src"] == ["'self'", "data:"]


def test_the_api_and_error_pages_carry_the_policy_too(client, world_a):
    assert "script-src" in client.get("/api/v1/tenants/me")["Content-Security-Policy"]
    assert "script-src" in client.get("/no-such-page/")["Content-Security-Policy"]


def test_a_form_may_go_on_to_the_identity_providers_only(client, settings):
    from tests.oidc_provider import sso_settings_entries

    entry = {"name": "Corp", "client_id": "c", "client_secret": "s"}
    sso_settings_entries(
        settings,
        [
            {**entry, "id": "corp", "issuer": "https://idp.example.com/realms/corp"},
            {**entry, "id": "lab", "issuer": "http://127.0.0.1:9999"},
        ],
    )
    policy = _policy(client.get("/login/"))
    assert policy["form-action"] == ["'self'", "http://127.0.0.1:9999", "https://idp.example.com"]


def test_the_admin_renders_under_the_policy(admin_client):
    """Django's admin has no inline script or handler of its own (its
    scripts are files, their data in attributes): its pages carry the
    policy and nothing in them needs what the policy refuses."""
    for path in ("/admin/", "/admin/billing/pricebook/", "/admin/billing/pricebook/add/"):
        response = admin_client.get(path)
        assert response.status_code == 200, path
        page = Elements()
        page.feed(response.content.decode())
        assert all("src" in s or s.get("type") in DATA_TYPES for s in page.scripts), path
        assert page.inline_attributes == [], path
        assert page.styles == [], path
        assert re.search(r"script-src 'self' 'nonce-[\w-]+'", response["Content-Security-Policy"])


def test_the_redoc_page_alone_takes_inline_styles_and_its_scripts_stay_nonced(client):
    """Redoc's bundle adds style elements before it is given the nonce and
    runs its search in a blob worker: its page allows those (core.csp's
    csp_allowing), and nothing else; every other page keeps the nonce."""
    redoc = _policy(client.get("/api/redoc/"))
    assert redoc["style-src"] == ["'self'", "'unsafe-inline'"]
    assert redoc["worker-src"] == ["'self'", "blob:"]
    assert redoc["script-src"][0] == "'self'" and redoc["script-src"][1].startswith("'nonce-")
    assert len(redoc["script-src"]) == 2
    swagger = _policy(client.get("/api/docs/"))
    assert swagger["style-src"][1].startswith("'nonce-") and "worker-src" not in swagger
