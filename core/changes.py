"""Changes the gateway must see at once, told through PostgreSQL's
LISTEN/NOTIFY (no other server needed; embedded PostgreSQL has it too).

A notification is sent inside the writer's transaction and delivered when
it commits, so a gateway never reloads before the change is visible, and
never hears of one that was rolled back. Payloads:

- `terms:<tenant id>`: what a tenant's requests are held to changed (a key,
  its policy or budget, its plan, its credit): drop what is cached of it;
- `terms:*`: the same for every tenant (a price book changed);
- `correction:<id>`: the ledger corrected a spend account (SpendCorrection);
- `fleet`: the fleet changed (a replica registered, up or down, its GPUs,
  a pool, a served model, an adapter, a reservation): read it again.

The gateway's caches keep their short TTL, and its fleet a slow periodic
reload, as the fallback for a change made without a notification (a raw
SQL update, a lost connection)."""

from __future__ import annotations

from django.db import connection

CHANNEL = "gateway_changes"
EVERY_TENANT = "*"
FLEET = "fleet"
MANY = 1000


def notify(payload: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])


def terms_changed(tenant_id: int | None = None) -> None:
    """`tenant_id`'s terms changed (None: every tenant's)."""
    notify(f"terms:{EVERY_TENANT if tenant_id is None else tenant_id}")


def terms_changed_of(tenant_ids: set[int]) -> None:
    """Many tenants' terms changed (an invoice run): one statement, one
    notification each, or one for every tenant past `MANY`."""
    if len(tenant_ids) > MANY:
        terms_changed(None)
    elif tenant_ids:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, 'terms:' || t) FROM unnest(%s::bigint[]) t",
                [CHANNEL, sorted(tenant_ids)],
            )


def correction_written(correction_id: int) -> None:
    notify(f"correction:{correction_id}")


def fleet_changed() -> None:
    """The fleet the gateways route by changed (a bulk update sends no
    signal: the service that makes it calls this)."""
    notify(FLEET)
