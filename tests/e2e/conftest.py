"""Browser tests of the dashboard: a real control plane (tests/integration/api/conftest.py),
Debian's headless Chromium driven by selenium, one browser per module.

``CRUCIBLE_SCREENSHOTS=<dir>`` saves a screenshot of each page there (how
docs/screenshots/ is made); screenshots go to the test's temp dir otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.integration.api.conftest import Stack, start_stack

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver",)
BROWSER_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def _first(paths: tuple[str, ...], what: str) -> str:
    for p in paths:
        if Path(p).exists() or shutil.which(p):
            return p
    pytest.fail(f"{what} not found at {paths}: run `make setup` (apt: chromium chromium-driver)")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A control plane of its own (no warm pools: every lease is cold)."""
    yield from start_stack(tmp_path_factory.mktemp("dash"), pool_targets={})


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """One headless Chromium for the module; its console log is kept (CSP violations)."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = _first(CHROMIUM, "chromium")
    for flag in BROWSER_FLAGS:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(_first(CHROMEDRIVER, "chromedriver")), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where page screenshots go."""
    target = os.environ.get("CRUCIBLE_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def key_of(client: httpx.Client) -> str:
    """The API key a stack client sends."""
    return client.headers["authorization"].split(" ", 1)[1]


def session_client(stack: Stack, key: str) -> httpx.Client:
    """An httpx client signed in to the dashboard with ``key`` through the real form."""
    client = stack.make_client(None, follow_redirects=False)
    form = client.get("/dashboard/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf, form.text
    r = client.post("/dashboard/login", data={"csrf": csrf.group(1), "key": key})
    assert r.status_code == 303, r.text
    return client


def csrf_of(html: str) -> str:
    """The CSRF token of the first form on a page."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)
