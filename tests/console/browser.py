"""Headless Chromium for the console's browser tests: Debian's `chromium` (installed by
`make test` / `.ci/run`, else by `require_program` when root; else the tests skip naming why)
driven by Playwright from PyPI. Never `playwright install`: this uses the system binary."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.system_tools import require_program

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT_DIR_ENV = "ROCKETQ_CONSOLE_SCREENSHOTS"    # where screenshots go (default: a tmp dir)


@asynccontextmanager
async def chromium() -> AsyncIterator[object]:
    """A running headless Chromium (a Playwright `Browser`)."""
    executable = require_program("chromium", "chromium")
    playwright_api = pytest.importorskip("playwright.async_api", reason="the playwright package is not installed")
    async with playwright_api.async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            await browser.close()


def screenshot_dir(default: Path) -> Path:
    """$ROCKETQ_CONSOLE_SCREENSHOTS (e.g. docs/img) or `default`; made when missing."""
    chosen = Path(os.environ.get(SCREENSHOT_DIR_ENV) or default)
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen
