"""bench/gateway_hop: where the gateway's own hop goes, one request at a
time against the instant fake upstream. The fake called straight (the
floor) and four gateways, taking turns in rounds: one as deployed; one
whose recorder only validates its records (bench.hop_sinks: the Python
side of the ledger write, nothing sent to PostgreSQL); one whose records
wait in memory past the rows (no ledger write while it is measured, all
of it written when it stops); one whose event loop waits up to Python's
default 5 ms for the recorder's thread to hand over the interpreter's
lock, as the gateway did before GATEWAY["GIL_SWITCH_SECONDS"]. What
separates the first from the second and third is what the ledger write
costs the requests it overlaps on this machine, where PostgreSQL shares
the gateway's two cores.

    ./dev bench gateway_hop [--rounds 12] [--requests 1000]

Prints a table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()


from bench.common import LoadResult, bench_database, report_write  # noqa: E402
from bench.gateway import hop_arms_taking_turns  # noqa: E402

# (label, the gateway's environment) of each gateway arm.
GATEWAYS = (
    ("gateway, as deployed", {}),
    (
        "gateway, records validated only (nothing written)",
        {"SERVING_RECORD_SINK": "bench.hop_sinks.validated_only"},
    ),
    (
        "gateway, records written after the rows",
        {"GATEWAY_RECORD_FLUSH_SECONDS": "86400", "GATEWAY_RECORD_FLUSH_MAX": "100000000"},
    ),
    (
        "gateway, a thread holding the lock up to 5 ms (Python's default; as before)",
        {"GATEWAY_GIL_SWITCH_SECONDS": "0.005"},
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=1000, help="per arm and round")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    bench_database("bench_gateway_hop")  # a database of its own, migrated
    parts = hop_arms_taking_turns(
        list(GATEWAYS),
        name="gateway-hop",
        rounds=args.rounds,
        requests=args.requests,
        tokens=args.tokens,
        say=say,
    )

    merged = {label: LoadResult.merged(results) for label, results in parts.items()}
    direct = merged["fake upstream direct"]
    lines = [
        f"One request at a time, non-streaming, {args.rounds} rounds of {args.requests} "
        "requests per arm, the arms taking turns. Added: over the fake upstream called "
        "straight in the same rounds. Per-round p99: each round's own p99 of the arm "
        "(how far one round's tail moves). CPU: the server's user + system seconds per request.",
        "",
        "| arm | p50 ms | p90 ms | p99 ms | max ms | added p50 / p99 ms | per-round p99 ms, "
        "lowest - highest | server µs CPU / req |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, result in merged.items():
        per_round = [r.p("e2e_ms", 99) for r in parts[label]]
        added = (
            "-"
            if result is direct
            else f"+{result.p('e2e_ms', 50) - direct.p('e2e_ms', 50):.2f} / "
            f"+{result.p('e2e_ms', 99) - direct.p('e2e_ms', 99):.2f}"
        )
        lines.append(
            f"| {label} | {result.p('e2e_ms', 50):.2f} | {result.p('e2e_ms', 90):.2f} | "
            f"{result.p('e2e_ms', 99):.2f} | {max(result.e2e_ms):.2f} | {added} | "
            f"{min(per_round):.2f} - {max(per_round):.2f} | "
            f"{result.server_cpu_us_per_request:.0f} |"
        )
    deployed, validated, deferred, held_longer = (merged[label] for label, _ in GATEWAYS)
    p99 = lambda r: r.p("e2e_ms", 99) - direct.p("e2e_ms", 99)  # noqa: E731
    lines += [
        "",
        f"The target for the hop is ≤ 0.3 ms p50 / ≤ 1 ms p99 added. Of the deployed "
        f"gateway's added p99 (+{p99(deployed):.2f} ms), the ledger write overlapping the "
        f"requests accounts for +{p99(deployed) - p99(deferred):.2f} ms: validating the "
        f"records in the recorder's thread +{p99(validated) - p99(deferred):.2f} ms, the "
        f"rest (+{p99(deployed) - p99(validated):.2f} ms) encoding them for the COPY, the "
        "round trips and PostgreSQL's own work on the rows, which here shares the "
        "gateway's cores. The recorder's thread holds the interpreter's lock while it "
        "validates and encodes a flush; a request arriving meanwhile waits until the thread "
        "is asked to hand it over: after 0.5 ms as deployed (GATEWAY['GIL_SWITCH_SECONDS']), "
        f"5 ms by Python's default, where the added p99 was +{p99(held_longer):.2f} ms "
        f"(x {p99(deployed) / p99(held_longer):.2f} as deployed).",
    ]
    report_write(
        name="gateway_hop",
        title="Where the gateway's own hop goes (bench/gateway_hop.py)",
        command=f"./dev bench gateway_hop --rounds {args.rounds} --requests {args.requests}",
        body="\n".join(lines),
    )


if __name__ == "__main__":
    main()
