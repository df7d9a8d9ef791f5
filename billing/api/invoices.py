"""The invoice API. Tenants (an API key with `billing:read`, or a member's
session) read their own issued invoices and credit balance; finance staff
read every tenant's, move invoices through their states, issue credit
notes, and start and watch invoice runs."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api import invoice_serializers as s
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.finalizing import FinalizeEarly, finalize_early_request
from billing.invoicing.invoices import invoice_status_set
from billing.invoicing.runs import invoice_run_create
from billing.invoicing.selectors import invoice_get, invoice_list, invoice_run_list
from billing.spend.wallet import wallet_balances
from billing.tasks import invoice_run_enqueue
from core.api_errors import validated
from tenants.api.permissions import (
    IsFinanceStaff,
    require_tenant,
    scope_required,
    tenant_scope,
)

TAGS = ["invoices"]


def _early(request, params: dict) -> FinalizeEarly | None:
    """`finalize_early: true` with its reason (400 naming `reason` without)."""
    if not params.get("finalize_early"):
        return None
    return finalize_early_request(reason=params.get("reason"), by=request.user.get_username())


class InvoiceListView(APIView):
    permission_classes = [scope_required("billing:read")]

    @extend_schema(
        summary="Invoices, newest period first",
        parameters=[s.InvoiceListQueryIn],
        responses={200: s.InvoiceOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        params = validated(s.InvoiceListQueryIn, request.query_params)
        invoices = invoice_list(
            tenant=tenant_scope(request, params.get("tenant")), status=params.get("status")
        )
        return Response(s.InvoiceOut(invoices, many=True).data)


class InvoiceDetailView(APIView):
    permission_classes = [scope_required("billing:read")]

    @extend_schema(
        summary="One invoice with its lines and credit notes",
        responses={200: s.InvoiceDetailOut},
        tags=TAGS,
    )
    def get(self, request, pk: int):
        return Response(s.InvoiceDetailOut(invoice_get(tenant=tenant_scope(request), pk=pk)).data)


class InvoiceStatusView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Finalize a draft, or mark an invoice paid, void or uncollectible",
        description="A draft whose billing period has not ended is finalized only with "
        "`finalize_early: true` and a `reason` (recorded on the invoice); otherwise 409.",
        request=s.InvoiceTransitionIn,
        responses={200: s.InvoiceDetailOut},
        tags=TAGS,
    )
    def post(self, request, pk: int):
        params = validated(s.InvoiceTransitionIn, request.data)
        invoice_status_set(
            invoice_id=invoice_get(tenant=None, pk=pk).pk,
            to=params["status"],
            early=_early(request, params),
        )
        return Response(s.InvoiceDetailOut(invoice_get(tenant=None, pk=pk)).data)


class CreditNoteView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Issue a credit note against a finalized invoice",
        request=s.CreditNoteIn,
        responses={201: s.CreditNoteOut},
        tags=TAGS,
    )
    def post(self, request, pk: int):
        params = validated(s.CreditNoteIn, request.data)
        invoice = invoice_get(tenant=None, pk=pk)
        note = credit_note_create(invoice_id=invoice.pk, created_by=request.user, **params)
        return Response(s.CreditNoteOut(note).data, status=status.HTTP_201_CREATED)


class CreditBalanceView(APIView):
    permission_classes = [scope_required("billing:read")]

    @extend_schema(
        summary="Prepaid credit left, grant by grant, in the order it will be used",
        responses={200: s.CreditBalanceOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        tenant = require_tenant(request).tenant
        return Response(s.CreditBalanceOut(wallet_balances(tenant=tenant), many=True).data)


class InvoiceRunListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Invoice runs, newest first",
        responses={200: s.InvoiceRunOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        return Response(s.InvoiceRunOut(invoice_run_list()[:50], many=True).data)

    @extend_schema(
        summary="Queue an invoice run (every tenant whose period ended by as_of)",
        request=s.InvoiceRunIn,
        responses={202: s.InvoiceRunOut},
        tags=TAGS,
    )
    def post(self, request):
        params = validated(s.InvoiceRunIn, request.data)
        run = invoice_run_create(
            as_of=params.get("as_of") or timezone.now(),
            finalize=params["finalize"],
            requested_by=request.user,
            early=_early(request, params),
        )
        invoice_run_enqueue(run.pk)
        return Response(s.InvoiceRunOut(run).data, status=status.HTTP_202_ACCEPTED)


class InvoiceRunDetailView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(responses={200: s.InvoiceRunOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(s.InvoiceRunOut(invoice_run_list().get(pk=pk)).data)
