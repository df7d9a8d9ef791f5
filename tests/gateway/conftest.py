import pytest

from tests.gateway.fake_upstream import FakeUpstream


@pytest.fixture
def fake():
    """A fake OpenAI-compatible replica on loopback (tests/gateway/fake_upstream.py)."""
    upstream = FakeUpstream().start()
    yield upstream
    upstream.stop()
