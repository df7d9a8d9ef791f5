"""Headless Chromium (Debian's chromium and chromium-driver) driven by
Selenium against the live Django server of the test database. Screenshots
go to test-artifacts/browser/ (or $TEST_ARTIFACTS_DIR)."""

from __future__ import annotations

import os
import shutil
from importlib import import_module
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.services import require

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(
    os.environ.get("TEST_ARTIFACTS_DIR", Path(__file__).resolve().parents[2] / "test-artifacts")
)
# Without the background-networking flags Chromium tries Google's hosts,
# which this machine's closed network refuses (see the env notes).
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1400",
]


@pytest.fixture
def browser(tmp_path):
    require(
        shutil.which(CHROMIUM) is not None and shutil.which(CHROMEDRIVER) is not None,
        f"Chromium and ChromeDriver ({CHROMIUM}, {CHROMEDRIVER}): apt-get install chromium "
        "chromium-driver",
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    driver.downloads = downloads
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(request):
    """shot(name): a PNG of the page, named after the test."""
    folder = ARTIFACTS / "browser"
    folder.mkdir(parents=True, exist_ok=True)

    def shot(driver, name: str) -> Path:
        path = folder / f"{request.node.name}-{name}.png"
        driver.save_screenshot(str(path))
        return path

    return shot


@pytest.fixture
def demo_world(transactional_db, tmp_path, settings):
    """The demo tenants, logins, prices and fleet, with this month and the
    last of synthetic history (so every chart has data)."""
    from django.apps import apps

    from demo.history import demo_history_fill
    from demo.seeds.billing import cost_rates_demo_seed, prices_demo_seed

    # A transactional test may start from a database another one emptied:
    # put the Finance group (a data migration's row) back.
    import_module("tenants.migrations.0002_finance_group").create_finance_group(apps, None)
    settings.DEMO_KEYS_FILE = tmp_path / "keys.json"
    call_command("seed_demo", stdout=StringIO())
    cost_rates_demo_seed()
    prices_demo_seed()
    return demo_history_fill(months=1)
