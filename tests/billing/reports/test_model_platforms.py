"""A model's page shows the model's own figures everywhere: its "By
engine and GPU kind" rows are its revenue and the cost allocation booked
to it, placed on the platforms that served it, and add
up to its margin row, not the totals of the replicas it shares with a
second model, in two billing currencies."""

from __future__ import annotations

import csv
import io
from datetime import date
from decimal import Decimal

from billing.choices import ReportKind, RunStatus
from billing.models import FxRate, ModelPrice
from billing.reports.margin_reports import margin_report_build, margin_report_request
from metering.models import UsageRollup
from serving.models import ServedModel
from tests.billing.conftest import H0
from tests.factories import make_finance_user, make_tenant

D = Decimal
T1 = H0.replace(hour=14)  # two hours


def _use(tenant, replica, model, *, hour, seconds, completion):
    UsageRollup.objects.create(
        hour=hour,
        tenant=tenant,
        served_model=model,
        pool=replica.pool,
        replica=replica,
        device_seconds=D(seconds),
        completion_tokens=completion,
        requests_ok=1,
    )


def _world(world):
    """One shared pool (idle spread over its tenants) of two $1/h GPUs: a
    vLLM replica of `tiny` on g1, a TensorRT-LLM one on g2. On the vLLM
    replica a second model, `other`, also runs. Alpha bills in USD, Euro
    Co in EUR; $4 per M output tokens of tiny, $10 per M of other."""
    book = world.price().book
    other = ServedModel.objects.create(name="other")
    ModelPrice.objects.create(
        book=book,
        served_model=other,
        input_per_mtok=D("1"),
        cached_input_per_mtok=D("1"),
        output_per_mtok=D("10"),
    )
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    FxRate.objects.create(base="EUR", quote="USD", date=date(2026, 10, 5), rate=D("1.08"))
    pool = world.pool("shared")
    vllm = world.replica("r-vllm", pool, [world.gpu("g1")])
    trt = world.replica("r-trt", pool, [world.gpu("g2")])
    trt.engine = "trtllm"
    trt.save()
    _use(world.a, vllm, world.model, hour=H0, seconds=900, completion=1_000_000)
    _use(euro, trt, world.model, hour=H0, seconds=1200, completion=500_000)
    _use(euro, vllm, world.model, hour=H0 + (T1 - H0) / 2, seconds=600, completion=250_000)
    _use(world.a, vllm, other, hour=H0, seconds=1800, completion=2_000_000)
    run = world.allocate(start=H0, end=T1)
    assert run.status == "done", run.error


def test_the_model_page_shows_the_models_own_figures_by_platform(world, client):
    _world(world)
    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=H0, end=T1).pk
    )
    assert report.status == RunStatus.DONE, report.error

    # Exact, in nano-units: the model's platform rows add up to its margin row.
    rows = list(csv.DictReader(io.StringIO(report.csv)))
    margin = next(r for r in rows if r["level"] == "model" and r["model"] == "tiny")
    mine = [r for r in rows if r["level"] == "model_platform" and r["model"] == "tiny"]
    for column in ("revenue", "cost", "margin"):
        assert sum(D(r[column]) for r in mine) == D(margin[column]), column
    assert sum(int(r["tokens"]) for r in mine) == int(margin["tokens"]) == 1_750_000

    client.force_login(make_finance_user())
    page = client.get("/finance/models/tiny/")
    assert page.status_code == 200
    shown = page.context["margin"]
    platforms = {(r["engine_label"], r["gpu_kind"]): r for r in page.context["platforms"]}
    assert set(platforms) == {("vLLM", "T-100"), ("TensorRT-LLM (trtllm-serve)", "T-100")}
    for column in ("revenue", "cost"):
        assert sum(D(r[column]) for r in platforms.values()) == D(shown[column]), column
    assert sum(r["tokens"] for r in platforms.values()) == shown["tokens"]
    # Tokens where they ran: 1.25 M on vLLM (Alpha's, Euro Co's 0.25 M).
    assert platforms[("vLLM", "T-100")]["tokens"] == 1_250_000
    assert abs(platforms[("vLLM", "T-100")]["gpu_hours"] - 1500 / 3600) < 1e-9

    # Not the replicas' totals: the vLLM replica's also carry `other`.
    replicas = {(r["engine"], r["gpu_kind"]): r for r in report.tables["platform"]}
    whole = replicas[("vllm", "T-100")]
    assert D(whole["revenue"]) > D(platforms[("vLLM", "T-100")]["revenue"])
    assert D(whole["cost"]) > D(platforms[("vLLM", "T-100")]["cost"])
    assert sum(D(r["revenue"]) for r in replicas.values()) != D(shown["revenue"])
    assert sum(D(r["cost"]) for r in replicas.values()) != D(shown["cost"])
    html = page.content.decode()
    note = html.split('data-testid="model-platforms-note"')[1].split("</p>")[0]
    assert "own figures" in note and "adding up to its margin" in note
