"""The invoice pages: a tenant's member sees only its own issued invoices
(not another's, not drafts), each as a document it can download; finance
staff see every invoice, drafts too, and the runs with their progress;
the list is paged."""

from __future__ import annotations

from datetime import timedelta

from billing.models import Invoice
from tests.billing.conftest import NOV
from tests.factories import make_finance_user, make_member


def test_invoice_pages_show_a_member_only_their_tenants_invoices(client, world, issued):
    member = make_member(world.a)
    client.force_login(member.user)
    mine, theirs = issued[world.a.slug], issued[world.b.slug]

    listing = client.get("/invoices/")
    assert listing.status_code == 200
    assert mine.number.encode() in listing.content
    assert theirs.number.encode() not in listing.content

    page = client.get(f"/invoices/{mine.pk}/")
    assert page.status_code == 200 and b'data-testid="invoice-total">4.00 USD' in page.content
    download = client.get(f"/invoices/{mine.pk}/?download=1")
    assert download["Content-Disposition"] == f'attachment; filename="{mine.number}.html"'
    assert b"data-print" not in download.content  # the file is the document only
    assert b"<script" not in download.content
    assert client.get(f"/invoices/{theirs.pk}/").status_code == 404
    assert client.get(f"/invoices/{issued['draft'].pk}/").status_code == 404
    assert Invoice.objects.count() == 3


def test_finance_sees_every_invoice_and_the_runs_with_their_progress(client, world, issued):
    from billing.invoicing.runs import invoice_run_create, invoice_run_execute

    run = invoice_run_execute(run_id=invoice_run_create(as_of=NOV + timedelta(days=1)).pk)
    client.force_login(make_finance_user())

    page = client.get("/invoices/").content.decode()

    assert issued[world.a.slug].number in page and issued[world.b.slug].number in page
    assert "(draft)" in page  # drafts too, for finance
    assert 'data-testid="invoice-runs"' in page
    assert f"{run.tenants_done} / {run.tenants_total}" in page
    member = make_member(world.a)
    client.force_login(member.user)
    assert 'data-testid="invoice-runs"' not in client.get("/invoices/").content.decode()


def test_the_invoice_list_is_paged(client, world, issued, monkeypatch):
    from dashboard import invoices as invoice_pages

    monkeypatch.setattr(invoice_pages, "PAGE_SIZE", 2)
    client.force_login(make_finance_user())

    first = client.get("/invoices/")
    second = client.get("/invoices/", {"page": 2})

    assert len(first.context["invoices"]) == 2 and len(second.context["invoices"]) == 1
    seen = {i.pk for i in first.context["invoices"]} | {i.pk for i in second.context["invoices"]}
    assert seen == {issued[world.a.slug].pk, issued[world.b.slug].pk, issued["draft"].pk}
    assert "page 1 of 2 (3 invoices)" in first.content.decode()
    assert client.get("/invoices/", {"page": "x"}).status_code == 200  # the first page
