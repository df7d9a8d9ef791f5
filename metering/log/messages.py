"""What travels on the usage log: a gateway's flush, cut by partition into
one message each.

Subject `usage.p.{n}`, n = the record's replica (its tenant when it ran on
none) modulo the stream's partitions, so every record of a replica's hour
is in one partition and one writer's hands.

Payload: the records as JSON lines (CompletedRequest.to_bytes, the spool's
own form), compressed with zstd; headers name the codec, the uncompressed
size and the count.

Nats-Msg-Id: a digest of the message's (request id, phase) keys, in order.
The same records sent again (a flush retried after a lost acknowledgement,
a spool replayed from the same place) are the same id, and JetStream keeps
one within its duplicate window; a retry cut differently is a different id
and is deduplicated downstream by (request id, phase), as the ledger is.
(An id from the spool's segment and offset was the other choice: a spool
adopted from a dead process renumbers its segments, and a batch read again
from the same offset may end further on, so the same start would name
different records.)"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson
import pyarrow as pa

from serving.records import CompletedRequest

SUBJECT_PREFIX = "usage.p"
SUBJECTS = f"{SUBJECT_PREFIX}.*"
CODEC = "zstd-jsonl-1"
H_CODEC, H_SIZE, H_RECORDS, H_ID = "Gl-Codec", "Gl-Size", "Gl-Records", "Nats-Msg-Id"
MAX_PAYLOAD = 900 * 1024  # under NATS's default 1 MiB max_payload, headers included


class MessageInvalid(ValueError):
    """A message on the log that is not one of ours."""


@dataclass(frozen=True)
class Message:
    subject: str
    payload: bytes
    headers: dict[str, str]
    records: int

    @property
    def msg_id(self) -> str:
        return self.headers[H_ID]


def subject(partition: int) -> str:
    return f"{SUBJECT_PREFIX}.{partition}"


def partition_of(record: CompletedRequest, partitions: int) -> int:
    return _partition(record.replica_id, record.tenant_id, partitions)


def _partition(replica_id, tenant_id, partitions: int) -> int:
    key = replica_id if replica_id is not None else tenant_id
    return int(key) % partitions


def messages(records: Iterable[CompletedRequest], *, partitions: int) -> list[Message]:
    """A gateway's records: one message per partition they fall in (more
    when one would pass MAX_PAYLOAD), in partition order."""
    return _messages(
        (
            _partition(r.replica_id, r.tenant_id, partitions),
            f"{r.request_id}\x1f{r.phase}",
            r.to_bytes(),
        )
        for r in records
    )


def event_messages(rows: Iterable[Mapping], *, partitions: int) -> list[Message]:
    """Events validated by the ledger's validator (the ingestion API's on
    this path: each a mapping of the ledger's columns, its `source` among
    them), as messages like a gateway's."""
    return _messages(
        (
            _partition(e["replica_id"], e["tenant_id"], partitions),
            f"{e['request_id']}\x1f{e['phase']}",
            orjson.dumps(e, default=str),
        )
        for e in rows
    )


def _messages(items: Iterable[tuple[int, str, bytes]]) -> list[Message]:
    by_partition: dict[int, list[tuple[str, bytes]]] = {}
    for partition, key, line in items:
        by_partition.setdefault(partition, []).append((key, line))
    out = []
    for partition in sorted(by_partition):
        out.extend(_encoded(subject(partition), by_partition[partition]))
    return out


def _encoded(to: str, items: Sequence[tuple[str, bytes]]) -> list[Message]:
    raw = b"\n".join(line for _, line in items)
    payload = pa.compress(raw, codec="zstd", asbytes=True)
    if len(payload) > MAX_PAYLOAD and len(items) > 1:
        half = len(items) // 2
        return _encoded(to, items[:half]) + _encoded(to, items[half:])
    keys = "\n".join(key for key, _ in items).encode()
    headers = {
        H_ID: hashlib.blake2b(keys, digest_size=16).hexdigest(),
        H_CODEC: CODEC,
        H_SIZE: str(len(raw)),
        H_RECORDS: str(len(items)),
    }
    return [Message(subject=to, payload=payload, headers=headers, records=len(items))]


def events(payload: bytes, headers: dict[str, str] | None) -> list[dict]:
    """The event mappings a message carries (as the ledger takes them:
    times as RFC 3339 strings, milliseconds as decimal strings)."""
    headers = headers or {}
    if headers.get(H_CODEC) != CODEC:
        raise MessageInvalid(f"codec {headers.get(H_CODEC)!r}, not {CODEC}")
    try:
        size = int(headers[H_SIZE])
        raw = pa.decompress(payload, decompressed_size=size, codec="zstd", asbytes=True)
        found = [orjson.loads(line) for line in raw.split(b"\n") if line]
    except (KeyError, ValueError, OSError, pa.ArrowException) as exc:
        raise MessageInvalid(f"unreadable payload: {exc}") from exc
    if str(len(found)) != headers.get(H_RECORDS):
        raise MessageInvalid(f"{len(found)} records, the header says {headers.get(H_RECORDS)}")
    return found
