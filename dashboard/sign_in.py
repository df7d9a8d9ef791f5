"""The sign-in page: a button per single sign-on provider the operator
configured (settings.OIDC_PROVIDERS), and the password form unless password
sign-in is off (settings.PASSWORD_LOGIN)."""

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import reverse

from tenants.sign_in_limits import LockingAuthenticationForm


class SignInView(auth_views.LoginView):
    # Password guessing locked out with backoff (tenants.sign_in_limits).
    authentication_form = LockingAuthenticationForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.locked is not None:  # a 429 that says when to try again
            response.status_code = 429
            response["Retry-After"] = str(form.locked.seconds)
        return response

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["sso_providers"] = [
            {"name": p["name"], "url": reverse("openid_connect_login", args=[p["id"]])}
            for p in settings.OIDC_PROVIDERS
        ]
        context["password_login"] = settings.PASSWORD_LOGIN
        return context

    def post(self, request, *args, **kwargs):
        if not settings.PASSWORD_LOGIN:
            response = self.get(request, *args, **kwargs)
            response.status_code = 403
            return response
        return super().post(request, *args, **kwargs)
