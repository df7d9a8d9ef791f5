"""Energy and emissions per tenant, model and pool, hour by hour, as the
booked allocation computes them; worked by hand. The rows of an hour add
up to the fleet's energy in it: the tenants' plus the idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Sum

from metering.models import EnergyHour
from serving.models import GridIntensity
from tests.billing.conftest import H0


def rows(hour):
    return {
        (r.tenant_id, r.served_model_id, r.pool_id): (r.kwh, r.co2e_g)
        for r in EnergyHour.objects.filter(hour=hour)
    }


def test_an_hours_energy_is_its_users_busy_draw_and_its_idle_draw_adding_up(world):
    """T-100: 100 W idle, 400 W busy; PUE 1.5. r1 holds g1; g2 is spare.
    At H0 Alpha used r1 1,800 s and Bravo 900 s: busy 0.75 of the hour.
    g1: busy 0.4 kW x 0.75 x 1.5 = 0.45 kWh, Alpha 2/3 of it (0.3) and
    Bravo 1/3 (0.15); idle 0.1 x 0.25 x 1.5 = 0.0375 kWh, the pool's.
    g2: idle all hour, 0.15 kWh, no pool's. The fleet: 0.6375 kWh.
    The lab's grid: 200 g/kWh at H0 (its own figure), 400 the year's
    average (the hour after)."""
    pool = world.pool("shared")
    g1 = world.gpu("g1")
    world.gpu("g2")
    r1 = world.replica("r1", pool, [g1])
    world.rate("pue", "1.5", "ratio")
    GridIntensity.objects.create(
        site="lab", period="year", start=datetime(2026, 1, 1, tzinfo=UTC), g_per_kwh=400
    )
    GridIntensity.objects.create(site="lab", period="hour", start=H0, g_per_kwh=200)
    world.use(world.a, r1, 1800)
    world.use(world.b, r1, 900)

    run = world.allocate(end=H0 + timedelta(hours=2))

    assert run.status == "done" and not [w for w in run.warnings if "intensity" in w]
    model = world.model.pk
    assert rows(H0) == {
        (world.a.pk, model, pool.pk): (Decimal("0.300000"), Decimal("60.000")),
        (world.b.pk, model, pool.pk): (Decimal("0.150000"), Decimal("30.000")),
        (None, None, pool.pk): (Decimal("0.037500"), Decimal("7.500")),
        (None, None, None): (Decimal("0.150000"), Decimal("30.000")),
    }
    fleet = EnergyHour.objects.filter(hour=H0).aggregate(kwh=Sum("kwh"), g=Sum("co2e_g"))
    assert (fleet["kwh"], fleet["g"]) == (Decimal("0.637500"), Decimal("127.500"))
    # The hour after, nobody busy: 0.15 kWh each, at the year's 400 g/kWh.
    assert rows(H0 + timedelta(hours=1)) == {
        (None, None, pool.pk): (Decimal("0.150000"), Decimal("60.000")),
        (None, None, None): (Decimal("0.150000"), Decimal("60.000")),
    }

    # Again: the same rows, not twice.
    world.allocate(end=H0 + timedelta(hours=2))
    assert EnergyHour.objects.count() == 6


def test_a_site_without_a_grid_intensity_is_named_and_counts_no_emissions(world):
    pool = world.pool("shared")
    r1 = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, r1, 3600)
    run = world.allocate()
    assert "no grid intensity (no emissions counted) at: 'lab'" in run.warnings
    (row,) = EnergyHour.objects.filter(tenant=world.a)
    assert row.kwh == Decimal("0.400000") and row.co2e_g == 0  # no PUE: 1.0


def test_a_scenarios_allocation_writes_no_energy(world):
    from billing.models import CostScenario

    pool = world.pool("shared")
    r1 = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, r1, 3600)
    scenario = CostScenario.objects.create(
        name="cheaper power", start=H0, end=H0 + timedelta(hours=1)
    )
    world.allocate(scenario=scenario)
    assert not EnergyHour.objects.exists()


def test_the_usage_export_carries_each_tenants_energy_and_emissions(world):
    """The hand-worked hour above through the export: Alpha's key reads its
    own 0.3 kWh and 60 g (JSON and CSV); an hour not yet allocated reads null."""
    import csv
    import io

    from tenants.choices import Scope
    from tenants.services import api_key_create
    from tests.conftest import client_for_key

    pool = world.pool("shared")
    r1 = world.replica("r1", pool, [world.gpu("g1")])
    world.rate("pue", "1.5", "ratio")
    GridIntensity.objects.create(site="lab", period="hour", start=H0, g_per_kwh=200)
    world.use(world.a, r1, 1800)
    world.use(world.b, r1, 900)
    world.use(world.a, r1, 600, hour=H0 + timedelta(hours=5))  # not allocated
    world.allocate()

    _key, secret = api_key_create(tenant=world.a, name="esg", scopes=[Scope.USAGE_READ])
    client = client_for_key(secret)
    query = {
        "start": H0.isoformat(),
        "end": (H0 + timedelta(hours=6)).isoformat(),
        "group_by": "hour",
    }
    rows = client.get("/api/v1/usage", query).json()["results"]
    assert [(r["tenant"], r["energy_kwh"], r["co2e_g"]) for r in rows] == [
        (world.a.slug, "0.300000", "60.000"),
        (world.a.slug, None, None),
    ]
    answer = client.get("/api/v1/usage", {**query, "format": "csv"})
    text = b"".join(answer.streaming_content).decode()
    first = next(csv.DictReader(io.StringIO(text)))
    assert (first["energy_kwh"], first["co2e_g"]) == ("0.300000", "60.000")


def test_the_usage_page_and_the_plan_page_show_energy_and_emissions(world):
    """The tenant sees its own (Alpha: 0.3 kWh, 60 g; 0.3 kWh a million
    tokens of its 1,000,000), finance sees every tenant's and the idle."""
    from planning.runs import plan_run_create, plan_run_execute
    from tests.conftest import client_for_user
    from tests.factories import make_finance_user, make_member

    pool = world.pool("shared")
    r1 = world.replica("r1", pool, [world.gpu("g1")])
    world.rate("pue", "1.5", "ratio")
    GridIntensity.objects.create(site="lab", period="hour", start=H0, g_per_kwh=200)
    world.use(world.a, r1, 1800, completion=1_000_000)
    world.use(world.b, r1, 900)
    world.allocate()

    page = client_for_user(make_member(world.a).user).get("/usage/", {"days": 90})
    energy = page.content.decode().split('data-testid="energy"')[1].split("</table>")[0]
    assert "<td>tiny</td>" in energy and "0.300" in energy and "60 g" in energy
    assert "0.3000" in energy  # kWh per million tokens
    assert world.b.slug not in energy and "(idle)" not in energy

    plan_run_execute(run_id=plan_run_create(as_of=H0 + timedelta(days=1)).pk)
    plan = client_for_user(make_finance_user()).get("/finance/plan/").content.decode()
    table = plan.split('data-testid="energy"')[1].split("</table>")[0]
    assert world.a.slug in table and world.b.slug in table and "(idle)" in table
    # 0.45 kWh used and 0.0375 idle make the fleet's 0.4875; 97.5 g in all.
    assert "Tenants' 0.450 kWh and idle 0.038 kWh make the fleet's; 0.098 kg CO2e" in plan


def test_grid_intensities_are_entered_through_the_api_and_bad_ones_name_their_field(world):
    from tests.conftest import client_for_user
    from tests.factories import make_finance_user

    finance = client_for_user(make_finance_user())
    url = "/api/v1/fleet/grid-intensities"
    good = {"site": "lab", "period": "year", "start": "2026-01-01T00:00:00Z", "g_per_kwh": "290"}
    assert finance.post(url, good, format="json").status_code == 201
    for field, bad in [
        ("start", {**good, "start": "2026-03-01T00:00:00Z"}),  # a year starts on 1 January
        ("start", {**good, "period": "hour", "start": "2026-03-01T00:30:00Z"}),
        ("g_per_kwh", {**good, "start": "2027-01-01T00:00:00Z", "g_per_kwh": "-1"}),
        ("period", {**good, "period": "week"}),
    ]:
        answer = finance.post(url, bad, format="json")
        assert answer.status_code == 400, answer.json()
        assert answer.json()["error"]["field"] == field, (field, answer.json())
    again = finance.post(url, good, format="json")  # the same site, period and start
    assert again.status_code == 400
    assert GridIntensity.objects.count() == 1
