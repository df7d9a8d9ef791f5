"""The prices API, for platform finance staff: price book versions (list,
create from a date, edit or withdraw one not yet in force), plans (create;
edit one no started subscription uses), a tenant's subscriptions (move it
to a plan from a date) and its policy (gateway limits and budget).

A version in force is never edited (409 price_version_in_force: create a
new version from a date); a plan in use neither (409 plan_in_use); a
change dated before the current hour or into an invoiced period is a 409
naming effective_from. Every write is in the audit trail with who made it."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api import price_serializers as s
from billing.pricing.catalog import (
    price_book_version_create,
    price_book_version_update,
    price_book_version_withdraw,
)
from billing.pricing.catalog_selectors import (
    plan_get,
    plan_list,
    price_book_get,
    price_book_list,
    subscription_get,
    subscription_list,
)
from billing.pricing.plans import plan_create, plan_update, subscription_move, subscription_withdraw
from billing.spend.budgets import budget_check
from core.api_errors import validated
from tenants.api.permissions import IsFinanceStaff
from tenants.api.serializers import PolicyOut
from tenants.policies import tenant_policy_update
from tenants.selectors import tenant_for_finance

TAGS = ["prices"]


class FinanceView(APIView):
    permission_classes = [IsFinanceStaff]


class PriceBookListView(FinanceView):
    @extend_schema(
        summary="Price book versions with their status (newest first per name)",
        parameters=[s.PriceBookQueryIn],
        responses={200: s.PriceBookOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        name = validated(s.PriceBookQueryIn, request.query_params).get("name")
        return Response(s.PriceBookOut(price_book_list(name=name), many=True).data)

    @extend_schema(
        summary="A new version of a price book from a date (closes the version it supersedes)",
        request=s.PriceBookVersionIn,
        responses={201: s.PriceBookDetailOut},
        tags=TAGS,
    )
    def post(self, request):
        book = price_book_version_create(**validated(s.PriceBookVersionIn, request.data))
        return Response(
            s.PriceBookDetailOut(price_book_get(book_id=book.pk)).data,
            status=status.HTTP_201_CREATED,
        )


class PriceBookDetailView(FinanceView):
    @extend_schema(responses={200: s.PriceBookDetailOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(s.PriceBookDetailOut(price_book_get(book_id=pk)).data)

    @extend_schema(
        summary="Edit a version not yet in force (one in force: 409, create a new version)",
        request=s.PriceBookVersionUpdateIn,
        responses={200: s.PriceBookDetailOut},
        tags=TAGS,
    )
    def patch(self, request, pk: int):
        changes = validated(s.PriceBookVersionUpdateIn, request.data)
        book = price_book_version_update(book=price_book_get(book_id=pk), **changes)
        return Response(s.PriceBookDetailOut(price_book_get(book_id=book.pk)).data)

    @extend_schema(
        summary="Withdraw a version not yet in force (the one before runs on)",
        responses={204: None},
        tags=TAGS,
    )
    def delete(self, request, pk: int):
        price_book_version_withdraw(book=price_book_get(book_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class PlanListView(FinanceView):
    @extend_schema(
        summary="Plans, with their started and current subscriptions",
        responses={200: s.PlanOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        return Response(s.PlanOut(plan_list(), many=True).data)

    @extend_schema(
        summary="A new plan (new terms for tenants on a plan in use: a new plan, then a move)",
        request=s.PlanIn,
        responses={201: s.PlanOut},
        tags=TAGS,
    )
    def post(self, request):
        plan = plan_create(**validated(s.PlanIn, request.data))
        return Response(s.PlanOut(plan_list().get(pk=plan.pk)).data, status=status.HTTP_201_CREATED)


class PlanDetailView(FinanceView):
    @extend_schema(
        summary="Edit a plan no started subscription uses (one in use: 409)",
        request=s.PlanUpdateIn,
        responses={200: s.PlanOut},
        tags=TAGS,
    )
    def patch(self, request, pk: int):
        changes = validated(s.PlanUpdateIn, request.data)
        plan = plan_update(plan=plan_get(plan_id=pk), **changes)
        return Response(s.PlanOut(plan_list().get(pk=plan.pk)).data)


class SubscriptionListView(FinanceView):
    @extend_schema(
        summary="A tenant's subscriptions, latest first",
        responses={200: s.SubscriptionOut(many=True)},
        tags=TAGS,
    )
    def get(self, request, slug: str):
        tenant = tenant_for_finance(slug=slug)
        return Response(s.SubscriptionOut(subscription_list(tenant=tenant), many=True).data)

    @extend_schema(
        summary="Move the tenant to a plan from a date (ends the subscription in force there)",
        request=s.SubscriptionMoveIn,
        responses={201: s.SubscriptionOut},
        tags=TAGS,
    )
    def post(self, request, slug: str):
        tenant = tenant_for_finance(slug=slug)
        subscription = subscription_move(
            tenant=tenant, **validated(s.SubscriptionMoveIn, request.data)
        )
        return Response(s.SubscriptionOut(subscription).data, status=status.HTTP_201_CREATED)


class SubscriptionDetailView(FinanceView):
    @extend_schema(
        summary="Withdraw a move not yet started (a started subscription: 409)",
        responses={204: None},
        tags=TAGS,
    )
    def delete(self, request, slug: str, pk: int):
        tenant = tenant_for_finance(slug=slug)
        subscription_withdraw(subscription=subscription_get(tenant=tenant, subscription_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class PolicyView(FinanceView):
    @extend_schema(summary="A tenant's policy", responses={200: PolicyOut}, tags=TAGS)
    def get(self, request, slug: str):
        return Response(PolicyOut(tenant_for_finance(slug=slug).policy).data)

    @extend_schema(
        summary="Change a tenant's gateway limits and budget (held at the gateway at once)",
        request=s.PolicyIn,
        responses={200: PolicyOut},
        tags=TAGS,
    )
    def patch(self, request, slug: str):
        tenant = tenant_for_finance(slug=slug)
        changes = validated(s.PolicyIn, request.data)
        with transaction.atomic():  # the policy and the budget block it implies, or neither
            policy = tenant_policy_update(tenant=tenant, **changes)
            budget_check(tenant=tenant)
        policy.refresh_from_db()
        return Response(PolicyOut(policy).data)
