"""A small fleet and two tenants for the ledger's tests, and a maker of
usage events shaped as a serving tier sends them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection

from serving.models import Pool, Replica, ServedModel
from serving.services import local_gpu_ensure, pool_ensure, replica_register, served_model_ensure
from serving.tiny_model import MODEL_NAME, model_config
from tenants.models import Tenant
from tests.factories import make_tenant

T0 = datetime(2026, 10, 5, 12, tzinfo=UTC)


@dataclass
class Ledger:
    a: Tenant
    b: Tenant
    model: ServedModel
    pool: Pool
    replica: Replica
    other_replica: Replica

    def event(self, request_id: str, /, *, tenant: Tenant | None = None, **fields) -> dict:
        """A completed request on `replica`: sent at T0, 100 ms queued,
        200 ms to first token, 700 ms generating."""
        start = fields.pop("at", T0)
        values = {
            "request_id": request_id,
            "tenant_id": (tenant or self.a).pk,
            "model": self.model.name,
            "replica_id": self.replica.pk,
            "prompt_tokens": 20,
            "cached_tokens": 0,
            "completion_tokens": 10,
            "received_at": start,
            "sent_at": start,
            "first_token_at": start + timedelta(milliseconds=300),
            "ended_at": start + timedelta(seconds=1),
            "queue_ms": Decimal("100"),
            "ttft_ms": Decimal("200"),
            "generation_ms": Decimal("700"),
            "status": "ok",
            "http_status": 200,
        }
        values.update(fields)
        return values


def disaggregated_pair(ledger: Ledger) -> tuple[Replica, Replica]:
    """A disaggregated pool's prefill and decode replicas of the ledger's model."""
    pool = pool_ensure(name="disagg", disaggregated=True)
    made = {
        role: replica_register(
            name=f"{role}-1",
            base_url=f"http://127.0.0.1:{port}",
            model=ledger.model,
            pool=pool,
            gpus=[local_gpu_ensure(serial=f"gpu-{role}")],
            role=role,
        )
        for role, port in (("prefill", 9101), ("decode", 9102))
    }
    return made["prefill"], made["decode"]


@pytest.fixture
def ledger(db) -> Ledger:
    return _ledger_make()


@pytest.fixture
def ledger_committed(transactional_db) -> Iterator[Ledger]:
    """The same, committed: for tests whose writers run on connections of
    their own (threads). The ledger is emptied afterwards: the flush after
    a transactional test leaves it (Django does not manage its table)."""
    yield _ledger_make()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE metering_usageevent")


def _ledger_make() -> Ledger:
    model = served_model_ensure(name=MODEL_NAME, config=model_config())
    pool = pool_ensure(name="shared")
    replicas = [
        replica_register(
            name=name,
            base_url=f"http://127.0.0.1:{port}",
            model=model,
            pool=pool,
            gpus=[local_gpu_ensure(serial=f"gpu-{name}")],
        )
        for name, port in (("r1", 9001), ("r2", 9002))
    ]
    return Ledger(
        a=make_tenant(name="Alpha"),
        b=make_tenant(name="Bravo"),
        model=model,
        pool=pool,
        replica=replicas[0],
        other_replica=replicas[1],
    )
