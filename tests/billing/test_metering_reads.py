"""Billing reads usage only through metering's selectors: no billing source
names a metering table in SQL or queries a metering model itself, so
metering can change how usage is stored without billing noticing."""

from __future__ import annotations

import re
from pathlib import Path

from django.apps import apps

import billing

BILLING = Path(billing.__file__).parent


def _billing_sources() -> dict[Path, str]:
    return {path: path.read_text() for path in sorted(BILLING.rglob("*.py"))}


def test_billing_names_no_metering_table():
    tables = {model._meta.db_table for model in apps.get_app_config("metering").get_models()}
    assert "metering_usagerollup" in tables
    found = [
        f"{path.relative_to(BILLING)}: {table}"
        for path, source in _billing_sources().items()
        for table in sorted(tables)
        if table in source.lower()
    ]
    assert found == [], "read it through a function in metering/selectors/"


def test_billing_queries_no_metering_model():
    names = "|".join(model.__name__ for model in apps.get_app_config("metering").get_models())
    query = re.compile(rf"\b({names})\.(objects|_default_manager|_base_manager)\b")
    found = [
        f"{path.relative_to(BILLING)}: {match.group(0)}"
        for path, source in _billing_sources().items()
        for match in query.finditer(source)
    ]
    assert found == [], "read it through a function in metering/selectors/"
