"""bulk_create by COPY (core.db_copy.instances_create): what the invoice run
writes its invoices with. Every field reads back as the ORM would have
written it, keys come from the table's own sequence, and a row the table
refuses fails the whole COPY: nothing of it is written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction

from billing.models import Invoice, Issuer
from core.db_copy import instances_create
from tenants.services import tenant_create

pytestmark = pytest.mark.django_db

JAN, FEB, MAR = (datetime(2026, m, 1, tzinfo=UTC) for m in (1, 2, 3))


def _invoice(tenant, issuer, start, end, **fields) -> Invoice:
    return Invoice(
        tenant=tenant, issuer=issuer, currency="EUR", period_start=start, period_end=end, **fields
    )


def test_copied_invoices_read_back_as_written_with_keys_from_the_sequence():
    tenant = tenant_create(name="Copied", slug="copied")
    issuer = Issuer.objects.create(name="Issuer of copies")
    fingerprint = {"2026-01-01T00:00:00+00:00": {"rows": 3, "tokens": "12"}}
    made = [
        _invoice(
            tenant,
            issuer,
            JAN,
            FEB,
            total_minor=1234,
            usage_fingerprint=fingerprint,
            warnings=["a price missing for `m`", 'quotes " and \\ kept'],
            rated_at=FEB,
        ),
        _invoice(tenant, issuer, FEB, MAR),
    ]
    instances_create(Invoice, made, connection)

    assert all(i.pk is not None and not i._state.adding for i in made)
    first, second = (Invoice.objects.get(pk=i.pk) for i in made)
    assert (first.total_minor, first.usage_fingerprint, first.rated_at) == (1234, fingerprint, FEB)
    assert first.warnings == ["a price missing for `m`", 'quotes " and \\ kept']
    assert (second.status, second.number, second.warnings, second.rated_at) == (
        "draft",
        "",
        [],
        None,
    )
    assert first.created_at is not None and first.created_at == made[0].created_at
    later = Invoice.objects.create(
        tenant=tenant,
        issuer=issuer,
        currency="EUR",
        period_start=MAR,
        period_end=JAN.replace(year=2027),
    )
    assert later.pk > max(i.pk for i in made)


def test_a_refused_row_writes_none_of_the_copy():
    tenant = tenant_create(name="Refused copy", slug="refused-copy")
    issuer = Issuer.objects.create(name="Issuer of refusals")
    # The second repeats the first's live period: invoice_one_per_period.
    made = [_invoice(tenant, issuer, JAN, FEB), _invoice(tenant, issuer, JAN, FEB)]
    with pytest.raises(IntegrityError, match="invoice_one_per_period"), transaction.atomic():
        instances_create(Invoice, made, connection)
    assert not Invoice.objects.filter(tenant=tenant).exists()
