"""The authentication backend when password sign-in is off
(settings.PASSWORD_LOGIN): it keeps sessions and permissions working but
accepts no password, so neither the sign-in page, the admin nor any other
form signs anyone in by one. Single sign-on logs users in itself."""

from django.contrib.auth.backends import ModelBackend


class NoPasswordBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        return None
