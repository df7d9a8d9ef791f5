"""The demo's prices seed once and invoice a demo tenant as expected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from demo.seeds.billing import prices_demo_seed
from demo.seeds.tenants import demo_seed
from metering.models import UsageRollup
from serving.models import Pool, ServedModel
from tenants.models import Tenant

OCT = datetime(2026, 10, 1, tzinfo=UTC)


def test_demo_prices_seed_once_and_bill_a_shared_tenant_with_its_discount_and_credit(db, tmp_path):
    demo_seed(secrets_path=tmp_path / "keys.json", password="pw")
    assert prices_demo_seed() > 0
    assert prices_demo_seed() == 0
    hooli = Tenant.objects.get(slug="hooli")
    UsageRollup.objects.create(
        hour=OCT + timedelta(hours=1),
        tenant=hooli,
        served_model=ServedModel.objects.get(name="tiny-llama"),
        pool=Pool.objects.create(name="demo-shared", kind="shared"),
        completion_tokens=20_000_000,  # 10 M at $0.80 + 10 M at $0.60 = $14
        requests_ok=1,
    )

    draft, _ = invoice_draft_build(
        tenant=hooli, period_start=OCT, period_end=datetime(2026, 11, 1, tzinfo=UTC)
    )
    invoice = invoice_finalize(invoice_id=draft.pk)

    amounts = {line.kind: line.amount_minor for line in invoice.lines.all()}
    assert amounts["discount"] == -70  # 5% of $14
    assert amounts["credit"] == -1330  # the $50 welcome credit covers the rest
    assert invoice.total_minor == 0 and invoice.status == "paid"
    tokens = [line.amount_minor for line in invoice.lines.all() if line.kind == "tokens"]
    assert sorted(tokens) == [600, 800]
