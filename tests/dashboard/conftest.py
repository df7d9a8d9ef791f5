"""The pages show billing's figures: they use billing's costed fleet and
its issued invoices (tests/billing/conftest.py)."""

from tests.billing.conftest import issued, stripe_fake, world  # noqa: F401 (page tests' fixtures)
