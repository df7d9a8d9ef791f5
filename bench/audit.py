"""bench/audit: what the audit trail's triggers and the webhook events cost
the writes they watch, side by side in one run.

In a database of its own (migrated here), with N tenants (2,000 by
default), each with a policy, an API key and a webhook endpoint, and one
operator endpoint:

- the API keys' use marks (api_keys_mark_used, every few seconds from each
  gateway): an audited table whose changed column is ignored, so the
  trigger runs and writes nothing;
- a change to every tenant's policy (one audit entry each);
- N invoice.finalized events emitted at once (an invoice run's outbox: the
  events, a delivery to the tenant's endpoint and one to the operator's,
  the owners' emails built), against the same run with nothing listening.

Each write runs with the audit triggers on and off (ALTER TABLE … DISABLE
TRIGGER inside the measured transaction, rolled back after), alternating,
3 times; the medians are reported with their ratio.

    ./dev bench audit [--tenants 2000]

Prints the table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402
from psycopg import sql  # noqa: E402

from audit.tracked import TRACKED  # noqa: E402
from audit.triggers import TRIGGER  # noqa: E402
from bench.common import database_switch, databases_drop, median, report_write  # noqa: E402

DATABASE = "gpu_ledger_bench_audit"
ROUNDS = 3


def _world(tenants: int) -> dict:
    from tenants.models import ApiKey, Tenant
    from tenants.services import api_key_create, tenant_create
    from webhooks.models import Endpoint
    from webhooks.signing import secret_generate

    for n in range(tenants):
        tenant = tenant_create(name=f"Audit bench {n:05d}", slug=f"audit-bench-{n:05d}")
        api_key_create(tenant=tenant, name="bench", scopes=["inference"])
    tenants = list(Tenant.objects.order_by("pk"))
    listens = {"event_types": ["invoice.finalized"], "secret": secret_generate()}
    Endpoint.objects.bulk_create(
        [Endpoint(tenant=t, url=f"https://93.184.215.14/{t.slug}", **listens) for t in tenants]
        + [Endpoint(tenant=None, url="https://93.184.215.14/ops", **listens)]
    )
    return {
        "keys": list(ApiKey.objects.values_list("pk", flat=True)),
        "tenants": tenants,
    }


def _timed(work: Callable[[], object], *, audited: bool, listening: bool = True) -> float:
    """Seconds of `work` in a transaction rolled back afterwards, with the
    audit triggers (and the webhook endpoints) on or off."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            if not audited:
                for tracked in TRACKED:
                    cursor.execute(
                        sql.SQL("ALTER TABLE {} DISABLE TRIGGER {}").format(
                            sql.Identifier(tracked.table), sql.Identifier(TRIGGER)
                        )
                    )
            if not listening:
                cursor.execute("UPDATE webhooks_endpoint SET active = false")
        started = time.perf_counter()
        work()
        took = time.perf_counter() - started
        transaction.set_rollback(True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=2000)
    args = parser.parse_args()

    from tenants.services import api_keys_mark_used
    from webhooks.choices import EventType
    from webhooks.services import EventDraft, events_emit

    home = connection.settings_dict["NAME"]
    database_switch(DATABASE, create=True)
    try:
        call_command("migrate", verbosity=0)
        print(f"seeding {args.tenants:,} tenants with a key and an endpoint each", flush=True)
        world = _world(args.tenants)
        now = timezone.now()

        def marks():
            api_keys_mark_used(used_at_by_key=dict.fromkeys(world["keys"], now))

        def policies():
            with connection.cursor() as cursor:
                cursor.execute("UPDATE tenants_tenantpolicy SET requests_per_minute = 600")

        def invoices():
            events_emit(
                [
                    EventDraft(
                        EventType.INVOICE_FINALIZED,
                        tenant,
                        f"invoice.finalized:bench:{tenant.pk}:{time.perf_counter_ns()}",
                        f"{tenant.name}: invoice issued",
                        {"number": f"B-{tenant.pk}", "total": "4.00", "currency": "USD"},
                    )
                    for tenant in world["tenants"]
                ]
            )

        cases = {
            f"{len(world['keys']):,} API keys' use marks (an ignored column: no entry)": (
                marks,
                {"on": {"audited": True}, "off": {"audited": False}},
            ),
            f"{args.tenants:,} tenant policies changed (an entry each)": (
                policies,
                {"on": {"audited": True}, "off": {"audited": False}},
            ),
            f"{args.tenants:,} invoice.finalized events (2 deliveries each)": (
                invoices,
                {"on": {"audited": True}, "off": {"audited": True, "listening": False}},
            ),
        }
        results = {}
        for name, (work, modes) in cases.items():
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            work()  # warm: plans cached, pages read
            for _ in range(ROUNDS):
                for mode, kwargs in modes.items():
                    times[mode].append(_timed(work, **kwargs))
            results[name] = {mode: median(t) for mode, t in times.items()}
            print(name, {m: f"{v * 1000:.1f} ms" for m, v in results[name].items()}, flush=True)
    finally:
        database_switch(home)
        databases_drop(DATABASE)

    lines = [
        "| write | with | without | ratio |",
        "|---|---|---|---|",
    ]
    labels = {
        0: ("audit trigger on", "off"),
        1: ("audit trigger on", "off"),
        2: ("an endpoint per tenant and the operator's listening", "none listening"),
    }
    for i, (name, r) in enumerate(results.items()):
        with_, without = labels[i]
        lines.append(
            f"| {name} | {r['on'] * 1000:,.1f} ms ({with_}) | {r['off'] * 1000:,.1f} ms "
            f"({without}) | x {r['on'] / r['off']:.2f} |"
        )
    lines += [
        "",
        f"Medians of {ROUNDS} alternating runs, each in a transaction rolled back after. "
        "The use marks are what a gateway writes every few seconds: the trigger compares "
        "each row's columns and writes nothing. An invoice run of 1,000 tenants took "
        "1.19 s (bench billing): its outbox adds the third row's cost per tenant.",
    ]
    report_write(
        name="audit",
        title="What the audit trail and webhook events cost the writes (bench/audit.py)",
        command=f"./dev bench audit --tenants {args.tenants}",
        body="\n".join(lines),
    )


if __name__ == "__main__":
    main()
