"""The Stripe webhook endpoint: 400 for a bad signature (nothing stored),
200 once the event is stored and handled (or was already), 5xx if we
could not store it, so Stripe delivers it again."""

from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing.payments.events import BadSignature, stripe_event_receive


@csrf_exempt
@require_POST
def stripe_webhook(request):
    try:
        event = stripe_event_receive(
            payload=request.body, signature=request.headers.get("Stripe-Signature", "")
        )
    except BadSignature as exc:
        return JsonResponse(
            {"error": {"code": "bad_signature", "message": str(exc), "field": "Stripe-Signature"}},
            status=400,
        )
    return JsonResponse({"received": event.event_id, "outcome": event.outcome})
