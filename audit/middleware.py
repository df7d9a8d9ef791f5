"""Every request's changes are recorded as its user's or API key's
(audit.context)."""

from audit.context import acting_as, actor_for_request


class AuditActorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with acting_as(lambda: actor_for_request(request)):
            return self.get_response(request)
