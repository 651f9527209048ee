"""Run `rocketq ...` commands in-process (click's CliRunner in a worker thread, so the command's own
event loop runs beside the test's, which serves the broker)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from click.testing import CliRunner, Result

from rocketq.cli import main


async def rocketq(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """`rocketq ARGS...`; `env` sets (or with None unsets) environment variables for the run."""
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, main, list(args), catch_exceptions=False, env=env)


async def rocketq_json(*args: str) -> Any:
    """Run with `--json` and parse stdout; fails the test on a non-zero exit."""
    result = await rocketq(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)
