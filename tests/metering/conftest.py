"""The ledger fixture lives in tests/ledger.py (shared with billing tests)."""

from tests.ledger import T0, Ledger  # noqa: F401 (imported from here by the tests)
