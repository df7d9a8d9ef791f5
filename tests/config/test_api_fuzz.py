"""The whole REST API, fuzzed from its own OpenAPI schema, as finance staff
and as a tenant's API key: no generated request, valid or not, gets a
server error, and every answer is one the schema describes (its status
code listed, its content type and its body matching that response's
schema), so a client generated from the schema can trust it.

Schemathesis loads /api/schema/ from the WSGI app and runs its examples,
coverage (boundary values) and fuzzing phases on every operation against
a database seeded with two tenants billing in two currencies, usage,
allocated cost, finalized and draft invoices, and a margin report.
Requests are committed for real (no test transaction), and nothing is
queued: Celery's send is replaced, so a fuzzed run never reaches a broker
or a worker.

FUZZ_EXAMPLES sets the examples per operation in the fuzzing phase
(default 6, about a minute and a half per caller on 2 cores); the run
prints how many cases it sent and every failure with the exception
behind it. For a long run: `FUZZ_EXAMPLES=200 pytest tests/config/test_api_fuzz.py -s`."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import traceback
from collections import Counter
from datetime import date, timedelta
from decimal import Decimal

import pytest
import schemathesis
from django.core.signals import got_request_exception
from django.core.wsgi import get_wsgi_application
from django.db import connections
from django.test import Client
from schemathesis.engine import events, from_schema

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import FxRate
from billing.reports.margin_reports import margin_report_build, margin_report_request
from tests.billing.conftest import H0, NOV, OCT, make_world
from tests.factories import make_finance_user, make_key

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "6"))


def _seed():
    """Alpha bills in USD, Bravo in EUR (with October's EUR/USD rates): an
    hour of usage on a costed shared GPU, October invoiced and finalized
    for both, a November draft for Alpha, and a margin report."""
    world = make_world()
    world.b.billing_currency = "EUR"
    world.b.save(update_fields=["billing_currency"])
    day = date(2026, 9, 1)
    while day < date(2026, 12, 1):
        FxRate.objects.create(base="EUR", quote="USD", date=day, rate=Decimal("1.08"))
        day += timedelta(days=1)
    world.price()
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 1800)
    world.use(world.b, replica, 900)
    world.allocate()
    for tenant in (world.a, world.b):
        world.tokens(tenant, hour=OCT + timedelta(hours=1), completion=1_000_000)
        make_key(tenant)
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        invoice_finalize(invoice_id=draft.pk)
    world.tokens(world.a, hour=NOV + timedelta(hours=1), completion=1_000_000)
    invoice_draft_build(tenant=world.a, period_start=NOV, period_end=NOV + timedelta(days=30))
    margin_report_build(
        report_id=margin_report_request(kind="adhoc", start=H0, end=H0 + timedelta(hours=1)).pk
    )
    return world


class _Recorder:
    """The WSGI app as the fuzzer sees it: signs every request in as the
    caller under test (finance's session and CSRF cookies, or a tenant's
    bearer key; never a credential the case generated), counts requests,
    and keeps each 5xx with the exception Django logged for it."""

    def __init__(self, app, *, session: str | None = None, key: str | None = None):
        self.app = app
        self.csrf = secrets.token_hex(16)
        self.cookie = f"sessionid={session}; csrftoken={self.csrf}" if session else ""
        self.key = key
        self.requests = 0
        self.statuses: Counter[int] = Counter()
        self.errors: list[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections = set()

    def close(self) -> None:
        """Close the connections the engine's threads opened (kept open
        between their requests: a connection per request costs more than
        the request)."""
        for connection in self._connections:
            connection.inc_thread_sharing()
            connection.close()

    def exception(self, sender, request=None, **kwargs):
        self._local.exception = traceback.format_exc(limit=-4)

    def __call__(self, environ, start_response):
        self._local.exception = ""
        environ.pop("HTTP_AUTHORIZATION", None)  # a generated bearer key would win
        environ.pop("HTTP_COOKIE", None)
        if self.key:
            environ["HTTP_AUTHORIZATION"] = f"Bearer {self.key}"
        else:
            environ["HTTP_COOKIE"] = self.cookie
            environ["HTTP_X_CSRFTOKEN"] = self.csrf
        status = {}

        def start(line, headers, exc_info=None):
            status["code"] = int(line.split()[0])
            return start_response(line, headers, exc_info)

        body = b"".join(self.app(environ, start))
        with self._lock:
            self._connections.add(connections["default"])
            self.requests += 1
            self.statuses[status["code"]] += 1
            if status["code"] >= 500:
                query = environ.get("QUERY_STRING", "")
                self.errors.append(
                    f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}"
                    f"{'?' + query if query else ''} -> {status['code']}\n"
                    f"{self._local.exception or body[:500]!r}"
                )
        return [body]


@pytest.fixture
def no_broker(monkeypatch):
    """Whatever a request queues (a run, a report, a Stripe sync) is dropped."""
    from celery.app.task import Task
    from celery.result import AsyncResult

    monkeypatch.setattr(Task, "apply_async", lambda self, *a, **kw: AsyncResult("fuzz"))


CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)


def _check_failures(recorder) -> list[str]:
    """Each distinct check failure of a scenario, with the request that
    caused it (a failure seen again in another case is said once)."""
    found = {}
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.failure_info is None:
                continue
            case = recorder.cases[case_id].value
            failure = check.failure_info.failure
            key = (recorder.label, check.name, failure.title)
            found.setdefault(
                key,
                f"{recorder.label} [{check.name}] {failure.title}: "
                f"{failure.message[:400]} ({case.method} {case.formatted_path})",
            )
    return list(found.values())


@pytest.mark.parametrize("caller", ["finance", "tenant"])
def test_every_answer_is_the_schemas_and_none_a_server_error(caller, no_broker, monkeypatch):
    world = _seed()
    if caller == "finance":
        browser = Client()
        browser.force_login(make_finance_user())
        app = _Recorder(get_wsgi_application(), session=browser.cookies["sessionid"].value)
    else:
        _, secret = make_key(world.a)
        app = _Recorder(get_wsgi_application(), key=secret)
    # Thousands of 4xx are expected; 5xx are collected with their traceback.
    # (After get_wsgi_application: django.setup() configures logging afresh.)
    monkeypatch.setattr(logging.getLogger("django.request"), "disabled", True)
    got_request_exception.connect(app.exception)
    config = schemathesis.Config.from_dict(
        {
            "seed": 20261123,
            "workers": 1,
            "continue-on-failure": True,
            "checks": {"enabled": False, **{check: {"enabled": True} for check in CHECKS}},
            "generation": {"max-examples": EXAMPLES, "mode": "all", "database": "none"},
            "phases": {
                "stateful": {"enabled": False},
                # No OPTIONS/TRACE/... probes: Django's routing answers those.
                "coverage": {"unexpected-methods": []},
            },
        }
    )
    try:
        schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app, config=config)
        failures = []
        for event in from_schema(schema).execute():
            if isinstance(event, events.NonFatalError | events.FatalError):
                failures.append(f"schemathesis: {getattr(event, 'value', event)}")
            if isinstance(event, events.ScenarioFinished):
                failures += _check_failures(event.recorder)
            if isinstance(event, events.EngineFinished):
                failures += [str(f) for f in event.failures]
    finally:
        got_request_exception.disconnect(app.exception)
        app.close()

    operations = sum(1 for _ in schema.get_all_operations())
    print(
        f"\nfuzzed {operations} operations as {caller}: {app.requests} requests, "
        f"statuses {dict(sorted(app.statuses.items()))}, {len(app.errors)} server errors"
    )
    assert app.requests > 100
    assert not app.errors, "\n\n".join(app.errors)
    assert not failures, f"{len(set(failures))} kinds of failure:\n" + "\n".join(
        sorted(set(failures))
    )
