"""Single sign-on: an operator's OpenID Connect providers (configured in
settings, config.sso) sign finance staff and tenants' members in. Their
claims say who a user is here, on every sign-in (claims.py); django-allauth
runs the protocol and checks the tokens (adapter.py)."""
