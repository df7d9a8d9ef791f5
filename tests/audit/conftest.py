# The billing tests' world and issued invoices, for the invoice entries.
from tests.billing.conftest import issued, world  # noqa: F401
