"""Finance compares platforms: cost per million tokens and
revenue per GPU-hour by engine and GPU kind, worked by hand for an hour:
a vLLM replica on a whole GPU beside a TensorRT-LLM replica on a MIG
instance of another, the rest of that GPU unheld; in the margin report
and on the model's page."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from billing.choices import ReportKind
from billing.reports.margin_reports import margin_report_build, margin_report_request
from billing.reports.margins import margin_data, margin_totals
from billing.reports.platforms import platform_frame, platform_table
from metering.models import UsageRollup
from serving.gpu_shares import Share
from serving.services import replica_gpu_shares_set
from tests.billing.conftest import H0
from tests.factories import make_finance_user

HOUR = timedelta(hours=1)
NANO = 10**9


def _fleet(world):
    """Two $1/h GPUs (no energy or opex) in one shared pool: g1 whole to a
    vLLM replica; g2 cut, a 3g.40gb instance to a TensorRT-LLM replica,
    4/7 held by nobody. Alpha: 1 M output tokens on vLLM (1,800 busy s),
    0.5 M on TensorRT-LLM (600 s), at $4 per M."""
    world.price()
    world.sku.mig_capable = True
    world.sku.save()
    pool = world.pool("shared", policy="platform")
    whole = world.replica("v-whole", pool, [world.gpu("g1")])
    mig = world.replica("t-mig", pool, [])
    mig.engine = "trtllm"
    mig.save()
    replica_gpu_shares_set(
        replica=mig,
        shares=[
            Share(gpu_id=world.gpu("g2").pk, sharing="mig", mig_profile="3g.40gb", mig_instance=1)
        ],
    )
    for replica, seconds, tokens in ((whole, 1800, 1_000_000), (mig, 600, 500_000)):
        UsageRollup.objects.create(
            hour=H0,
            tenant=world.a,
            served_model=world.model,
            pool=pool,
            replica=replica,
            device_seconds=Decimal(seconds),
            completion_tokens=tokens,
            requests_ok=1,
        )
    run = world.allocate()
    assert run.status == "done", run.error


def test_cost_per_million_tokens_and_revenue_per_gpu_hour_by_engine_and_gpu_kind(world):
    _fleet(world)
    data = margin_data(start=H0, end=H0 + HOUR)
    frame = platform_frame(start=H0, end=H0 + HOUR, revenue=data.detail)
    table = platform_table(frame).set_index(["engine", "gpu_kind"])

    vllm = table.loc[("vllm", "T-100")]
    assert (vllm["gpu_hours"], vllm["tokens"], vllm["cost"]) == (1, 1_000_000, NANO)
    # Alpha's $6 split by its device-seconds on each replica: 1,800 : 600.
    assert vllm["revenue"] == 4.5 * NANO
    assert (vllm["cost_per_mtok"], vllm["revenue_per_gpu_hour"]) == (1, 4.5)
    assert vllm["utilization_pct"] == 50

    trt = table.loc[("trtllm", "T-100 · MIG 3g.40gb")]
    assert trt["cost"] == 428_571_428  # 3/7 of $1, rounded down to the nano
    assert abs(trt["gpu_hours"] - 3 / 7) < 1e-12
    assert trt["revenue"] == 1.5 * NANO
    assert abs(trt["revenue_per_gpu_hour"] - 3.5) < 1e-9  # $1.50 over 3/7 h
    assert abs(trt["cost_per_mtok"] - 0.857142856) < 1e-9
    assert trt["engine_label"] == "TensorRT-LLM (trtllm-serve)"

    unheld = table.loc[("(none)", "T-100 · unheld")]
    assert (unheld["cost"], unheld["tokens"], unheld["revenue"]) == (571_428_572, 0, 0)
    # Nothing lost or made up: the hour's $2 of GPUs and $6 of revenue.
    totals = margin_totals(data)
    assert table["cost"].sum() == totals["cost"] == 2 * NANO
    assert table["revenue"].sum() == totals["revenue"] == 6 * NANO


def test_the_margin_report_and_the_models_page_show_each_platform(world, client):
    _fleet(world)
    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=H0, end=H0 + HOUR).pk
    )
    assert report.status == "done", report.error
    rows = {(r["engine"], r["gpu_kind"]): r for r in report.tables["platform"]}
    assert rows[("trtllm", "T-100 · MIG 3g.40gb")]["revenue"] == "1.50"
    assert ("vllm", "T-100") in rows
    assert "By engine and GPU kind" in report.html and 'data-testid="platform-bars"' in report.html
    assert "T-100 · MIG 3g.40gb" in report.csv

    client.force_login(make_finance_user())
    page = client.get(f"/finance/models/{world.model.name}/")
    assert page.status_code == 200
    shown = {(r["engine_label"], r["gpu_kind"]) for r in page.context["platforms"]}
    assert shown == {("vLLM", "T-100"), ("TensorRT-LLM (trtllm-serve)", "T-100 · MIG 3g.40gb")}
