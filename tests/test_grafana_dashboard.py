"""docs/operations/grafana-dashboard.json: valid JSON Grafana can import, whose queries use only
metrics a broker serves (scraped from a running broker's /metrics) and parse as PromQL (promtool)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from broker.broker import Broker
from client.api import ClientAPI
from tests.conftest import broker_config
from tests.helpers import free_port, pull_header, scrape_metrics, send
from tests.system_tools import require_program

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "operations" / "grafana-dashboard.json"
_METRIC = re.compile(r"\b(?:rocketmq|rocketq)_[a-z0-9_]+")
_LABEL_VALUES = re.compile(r"label_values\((.+), *\w+\)")
# What a family of each type puts in the exposition besides its own name.
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
             "summary": ("_count", "_sum", "_created")}


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def expressions() -> list[str]:
    """The PromQL of every panel target, and the series selector of every query variable (Grafana's
    `label_values(SELECTOR, LABEL)`)."""
    found = [target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            selector = _LABEL_VALUES.fullmatch(variable["query"]["query"])
            assert selector is not None, variable["query"]
            found.append(selector.group(1))
    return found


def served_names(text: str) -> set[str]:
    """Every series name the exposition has or, for a family with no sample yet, would have."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    panels = [panel for panel in board["panels"] if panel["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert all(target["expr"] and target["refId"] for target in panel["targets"]), panel["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    used = {name for expr in expressions() for name in _METRIC.findall(expr)}
    for needed in ("rocketmq_messages_in_total", "rocketmq_messages_out_total", "rocketmq_rpc_latency_bucket",
                   "rocketmq_consumer_lag_messages", "rocketmq_storage_size", "rocketq_connections"):
        assert needed in used


async def test_every_metric_the_dashboard_queries_is_served_by_a_broker(tmp_path: Path,
                                                                        client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path, metrics_port=free_port())) as broker:
        await send(client_api, broker.address, "dash", b"x")
        await client_api.pull_message(broker.address, pull_header(topic="dash", group="dash-g"), 3_000)
        await client_api.update_consumer_offset(broker.address, "dash-g", "dash", 0, 1)
        assert broker.metrics_port is not None
        text = await asyncio.to_thread(scrape_metrics, broker.metrics_port)
    served = served_names(text)
    used = {name for expr in expressions() for name in _METRIC.findall(expr)}
    assert used <= served, f"queried but not served: {sorted(used - served)}"


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    promtool = require_program("promtool", "prometheus")
    rules = [{"record": f"dashboard:query_{i}",
              "expr": expr.replace("$__rate_interval", "1m").replace("$cluster", ".*").replace("$node_id", ".*")}
             for i, expr in enumerate(expressions())]
    path = tmp_path / "rules.json"       # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
