"""A fake Stripe API server on loopback, for the real `stripe` SDK.

It keeps customers, invoices, invoice items, tax rates and credit notes
in memory, computes an invoice's tax as Stripe documents it for tax rates
(each line item's own: its amount times each of its rates, rounded to
the minor unit, half away from zero; the invoice's tax is the sum),
answers with objects shaped like Stripe's published examples
(tests/stripe_objects.json, from Stripe's OpenAPI fixtures), and honours
Idempotency-Key as Stripe does: the same key and parameters replay the
first answer (with `Idempotent-Replayed: true`); the same key with other
parameters is a 400 idempotency_error.

Faults on demand: `fail(path, "500")` answers 500 without doing anything;
`fail(path, "timeout")` does the work, keeps the answer for the key, and
answers too late for the client; `down = True` answers 503 to everything."""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

OBJECTS = json.loads((Path(__file__).parent / "stripe_objects.json").read_text())
API_KEY = "sk_test_fake_ledger"
WEBHOOK_SECRET = "whsec_test_fake_ledger"


def nested(pairs: list[tuple[str, str]]) -> dict:
    """Stripe's form encoding (`a[b][c]=v`, `a[0]=v`) back into a dict."""
    out: dict = {}
    for key, value in pairs:
        parts = re.findall(r"[^\[\]]+", key)
        target = out
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return out


def sign(payload: bytes, *, secret: str = WEBHOOK_SECRET, timestamp: int | None = None) -> str:
    """A Stripe-Signature header for `payload`, as Stripe computes it."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


@dataclass
class FakeStripe:
    customers: dict[str, dict] = field(default_factory=dict)
    invoices: dict[str, dict] = field(default_factory=dict)
    items: dict[str, dict] = field(default_factory=dict)
    credit_notes: dict[str, dict] = field(default_factory=dict)
    tax_rates: dict[str, dict] = field(default_factory=dict)
    writes: list[tuple[str, str]] = field(default_factory=list)  # (path, key) that did work
    requests: int = 0
    down: bool = False
    timeout_seconds: float = 2.0
    _faults: list[tuple[str, str]] = field(default_factory=list)
    _keys: dict[str, tuple[str, int, bytes]] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def fail(self, path_prefix: str, kind: str, times: int = 1) -> None:
        self._faults += [(path_prefix, kind)] * times

    def event(self, kind: str, obj: dict, *, event_id: str | None = None, created=None) -> bytes:
        """A webhook event's body, shaped like Stripe's."""
        body = copy.deepcopy(OBJECTS["event"])
        body.update(
            id=event_id or f"evt_{next(self._ids):08d}",
            type=kind,
            created=int(created or time.time()),
            data={"object": obj},
            api_version="2026-10-28.endive",
        )
        return json.dumps(body).encode()

    # --- the API ---------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, params: dict):
        routes = [
            ("POST", r"/v1/customers", self._customer_create),
            ("POST", r"/v1/invoices", self._invoice_create),
            ("GET", r"/v1/invoices/(in_\w+)", self._invoice_get),
            ("POST", r"/v1/invoices/(in_\w+)/finalize", self._invoice_finalize),
            ("POST", r"/v1/invoices/(in_\w+)/pay", self._invoice_to("paid")),
            ("POST", r"/v1/invoices/(in_\w+)/void", self._invoice_to("void")),
            (
                "POST",
                r"/v1/invoices/(in_\w+)/mark_uncollectible",
                self._invoice_to("uncollectible"),
            ),
            ("POST", r"/v1/invoiceitems", self._item_create),
            ("GET", r"/v1/invoiceitems", self._item_list),
            ("POST", r"/v1/credit_notes", self._credit_note_create),
            ("POST", r"/v1/tax_rates", self._tax_rate_create),
        ]
        for verb, pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                return handler(*match.groups(), params=params, query=query)
        return 404, _error("invalid_request_error", f"Unrecognized request URL ({path})")

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):010d}"

    def _customer_create(self, *, params, query):
        customer = copy.deepcopy(OBJECTS["customer"])
        customer.update(
            id=self._new_id("cus"),
            name=params.get("name"),
            email=params.get("email"),
            metadata=params.get("metadata", {}),
            created=int(time.time()),
            discount=None,
        )
        self.customers[customer["id"]] = customer
        return 200, customer

    def _invoice_create(self, *, params, query):
        if params.get("customer") not in self.customers:
            return 400, _error("invalid_request_error", "No such customer", param="customer")
        invoice = copy.deepcopy(OBJECTS["invoice"])
        invoice.update(
            id=self._new_id("in"),
            customer=params["customer"],
            currency=params.get("currency", "usd"),
            collection_method=params.get("collection_method", "charge_automatically"),
            description=params.get("description"),
            footer=params.get("footer"),
            metadata=params.get("metadata", {}),
            status="draft",
            amount_due=0,
            amount_paid=0,
            amount_remaining=0,
            total=0,
            subtotal=0,
            created=int(time.time()),
            hosted_invoice_url=None,
            lines={"object": "list", "data": [], "has_more": False, "url": "/v1/invoices/lines"},
        )
        self.invoices[invoice["id"]] = invoice
        return 200, invoice

    def _invoice_get(self, invoice_id, *, params, query):
        invoice = self.invoices.get(invoice_id)
        if invoice is None:
            return 404, _error("invalid_request_error", "No such invoice", param="id")
        return 200, invoice

    def _invoice_finalize(self, invoice_id, *, params, query):
        invoice = self.invoices.get(invoice_id)
        if invoice is None or invoice["status"] != "draft":
            return 400, _error("invalid_request_error", "This invoice is already finalized")
        total = invoice["total"]
        invoice.update(
            status="open" if total > 0 else "paid",
            amount_due=max(total, 0),
            amount_remaining=max(total, 0),
            hosted_invoice_url=f"https://invoice.stripe.test/i/{invoice_id}",
        )
        invoice["status_transitions"]["finalized_at"] = int(time.time())
        return 200, invoice

    def _invoice_to(self, status: str):
        allowed = {"paid": ("open", "uncollectible"), "void": ("open", "uncollectible")}
        allowed["uncollectible"] = ("open",)

        def handler(invoice_id, *, params, query):
            invoice = self.invoices.get(invoice_id)
            if invoice is None or invoice["status"] not in allowed[status]:
                current = invoice and invoice["status"]
                return 400, _error("invalid_request_error", f"invoice is {current}")
            invoice["status"] = status
            return 200, invoice

        return handler

    def _item_create(self, *, params, query):
        invoice = self.invoices.get(params.get("invoice", ""))
        if invoice is None or invoice["status"] != "draft":
            return 400, _error("invalid_request_error", "invoice is not a draft", param="invoice")
        item = copy.deepcopy(OBJECTS["invoiceitem"])
        item.update(
            id=self._new_id("ii"),
            amount=int(params["amount"]),
            currency=params.get("currency"),
            customer=params.get("customer"),
            description=params.get("description"),
            invoice=invoice["id"],
            metadata=params.get("metadata", {}),
            period={k: int(v) for k, v in params.get("period", {}).items()},
        )
        rate_ids = list(params.get("tax_rates", {}).values())
        if any(r not in self.tax_rates for r in rate_ids):
            return 400, _error("invalid_request_error", "No such tax rate", param="tax_rates")
        item["tax_rates"] = [self.tax_rates[r] for r in rate_ids]
        self.items[item["id"]] = item
        taxes = [
            {"amount": _tax(item["amount"], rate["percentage"]), "tax_rate": rate["id"]}
            for rate in item["tax_rates"]
        ]
        invoice["lines"]["data"].append(
            {
                "id": f"il_{item['id']}",
                "amount": item["amount"],
                "description": item["description"],
                "taxes": taxes,
            }
        )
        lines = invoice["lines"]["data"]
        subtotal = sum(line["amount"] for line in lines)
        tax = sum(t["amount"] for line in lines for t in line["taxes"])
        invoice.update(subtotal=subtotal, total_excluding_tax=subtotal, total=subtotal + tax)
        return 200, item

    def _tax_rate_create(self, *, params, query):
        if "percentage" not in params or "display_name" not in params:
            return 400, _error("invalid_request_error", "Missing required param", "percentage")
        rate = {
            "id": self._new_id("txr"),
            "object": "tax_rate",
            "active": True,
            "country": params.get("country"),
            "display_name": params["display_name"],
            "inclusive": params.get("inclusive") == "true",
            "percentage": float(params["percentage"]),
            "metadata": params.get("metadata", {}),
            "created": int(time.time()),
            "livemode": False,
        }
        self.tax_rates[rate["id"]] = rate
        return 200, rate

    def _item_list(self, *, params, query):
        data = [i for i in self.items.values() if i["invoice"] == query.get("invoice")]
        return 200, {"object": "list", "data": data, "has_more": False, "url": "/v1/invoiceitems"}

    def _credit_note_create(self, *, params, query):
        invoice = self.invoices.get(params.get("invoice", ""))
        if invoice is None or invoice["status"] == "draft":
            return 400, _error("invalid_request_error", "invoice not finalized", param="invoice")
        lines = list(params.get("lines", {}).values())
        if ("amount" in params) == bool(lines):
            return 400, _error("invalid_request_error", "one of amount or lines", param="amount")
        amount, subtotal, tax_amounts = int(params.get("amount", 0)), 0, []
        for line in lines:  # custom lines with their exact tax amounts
            taxes = list(line.get("tax_amounts", {}).values())
            if line.get("type") != "custom_line_item" or any(
                t.get("tax_rate") not in self.tax_rates for t in taxes
            ):
                return 400, _error("invalid_request_error", "bad credit note line", param="lines")
            net = int(line["unit_amount"]) * int(line.get("quantity", 1))
            subtotal += net
            tax_amounts += [{"amount": int(t["amount"]), "tax_rate": t["tax_rate"]} for t in taxes]
        if lines:
            amount = subtotal + sum(t["amount"] for t in tax_amounts)
        else:
            subtotal = amount
        # As Stripe documents it: on an open (or uncollectible) invoice a
        # note reduces what is due, and one that leaves nothing due marks it
        # paid; on a paid one, the note's whole amount must go somewhere
        # (here: out of band); nothing else takes a credit note.
        out_of_band = int(params["out_of_band_amount"]) if "out_of_band_amount" in params else None
        if invoice["status"] in ("open", "uncollectible"):
            if out_of_band is not None:
                return 400, _error(
                    "invalid_request_error",
                    "out_of_band_amount is only for a paid invoice",
                    param="out_of_band_amount",
                )
            if amount > invoice["amount_remaining"]:
                return 400, _error(
                    "invalid_request_error", "more than the invoice's amount remaining"
                )
            invoice["amount_due"] -= amount
            invoice["amount_remaining"] -= amount
            if invoice["amount_remaining"] == 0:
                invoice["status"] = "paid"
        elif invoice["status"] == "paid":
            if out_of_band != amount:
                return 400, _error(
                    "invalid_request_error",
                    "the refund, credit and out-of-band amounts must add up to the "
                    "note's post-payment amount",
                    param="out_of_band_amount",
                )
        else:
            return 400, _error("invalid_request_error", f"invoice is {invoice['status']}")
        note = copy.deepcopy(OBJECTS["credit_note"])
        note.update(
            id=self._new_id("cn"),
            invoice=invoice["id"],
            amount=amount,
            subtotal=subtotal,
            total=amount,
            tax_amounts=tax_amounts,
            memo=params.get("memo"),
            metadata=params.get("metadata", {}),
            out_of_band_amount=out_of_band,
        )
        self.credit_notes[note["id"]] = note
        return 200, note

    # --- the HTTP layer --------------------------------------------------

    def serve(self, method: str, raw_path: str, headers, body: bytes):
        """(status, extra headers, body bytes, delay seconds)."""
        with self._lock:
            self.requests += 1
            if headers.get("Authorization") != f"Bearer {API_KEY}":
                return 401, {}, _dump(_error("invalid_request_error", "Invalid API Key")), 0
            if self.down:
                return 503, {}, _dump(_error("api_error", "Stripe is down (fake)")), 0
            split = urlsplit(raw_path)
            path, query = split.path, dict(parse_qsl(split.query))
            fault = next((f for f in self._faults if path.startswith(f[0])), None)
            if fault:
                self._faults.remove(fault)
                if fault[1] == "500":
                    return 500, {}, _dump(_error("api_error", "injected fault")), 0
            key = headers.get("Idempotency-Key")
            fingerprint = f"{method} {path} {body.decode()}"
            if method == "POST" and key and key in self._keys:
                seen, status, stored = self._keys[key]
                if seen != fingerprint:
                    message = (
                        "Keys for idempotent requests can only be used with the same parameters"
                    )
                    return 400, {}, _dump(_error("idempotency_error", message)), 0
                return status, {"Idempotent-Replayed": "true"}, stored, 0
            status, payload = self.handle(method, path, query, nested(parse_qsl(body.decode())))
            encoded = _dump(payload)
            if method == "POST" and status == 200:
                self.writes.append((path, key or ""))
            if method == "POST" and key and status < 500:
                self._keys[key] = (fingerprint, status, encoded)
            delay = self.timeout_seconds if fault and fault[1] == "timeout" else 0
            return status, {}, encoded, delay

    def start(self) -> FakeStripe:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, extra, payload, delay = fake.serve(
                    self.command, self.path, self.headers, body
                )
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Request-Id", f"req_fake{fake.requests}")
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (an injected timeout)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _tax(amount: int, percentage: float) -> int:
    """A line's tax for one rate, as Stripe rounds it."""
    exact = Decimal(amount) * Decimal(str(percentage)) / 100
    return int(exact.quantize(Decimal(1), ROUND_HALF_UP))


def _error(kind: str, message: str, param: str | None = None) -> dict:
    return {"error": {"type": kind, "message": message, "param": param}}


def _dump(payload: dict) -> bytes:
    return json.dumps(payload).encode()
