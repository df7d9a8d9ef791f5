# The billing tests' world (tenants, a model, prices, usage by the hour).
from tests.billing.conftest import world  # noqa: F401
