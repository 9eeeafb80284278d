"""The Grafana dashboard and its provisioning: well-formed, every panel queries the `$datasource` variable
(so it imports into any Grafana), rates use `$__rate_interval`, the node panels follow `$node`, a row repeats
per job, and every metric family of the issue has a panel (the live check is test_prometheus.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "tide.json"
FAMILIES = [
    "tide_cluster_gpu_allocation_ratio", "tide_pool_gpu_allocation_ratio", "tide_node_gpu_allocation_ratio",
    "tide_gpu_utilization_ratio", "tide_gpu_memory_used_bytes", "tide_gpu_memory_bandwidth_utilization_ratio",
    "tide_gpu_pcie_throughput_bytes_per_second", "tide_gpu_sm_efficiency_ratio", "tide_gpu_fragmentation_ratio",
    "tide_queue_pending_jobs", "tide_queue_wait_seconds_bucket", "tide_gang_wait_seconds_bucket",
    "tide_preemptions_total", "tide_oom_total", "tide_placement_latency_seconds_bucket", "tide_queue_lent_gpus",
    "tide_queue_borrowed_gpus", "tide_pool_lent_gpus", "tide_pool_borrowed_gpus",
    "tide_feedback_memory_multiplier", "tide_feedback_affinity", "tide_gpu_power_watts",
    "tide_gpu_temperature_celsius", "tide_gpu_ecc_uncorrected_errors", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
]
# series that carry a node label (dcgm-exporter's is Hostname): a panel on them must filter by $node
NODE_SERIES = re.compile(r"\b(tide_node_\w+|tide_gpu_(?:utilization|memory|pcie|nvlink|sm|power|temperature|ecc|xid)\w*"
                         r"|DCGM_FI_\w+)\{([^}]*)\}")
SUBSTITUTE = {"pool": ".*", "node": ".*", "queue": ".*", "job": ".*", "__rate_interval": "5m"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel, variables set to 'all', $__rate_interval 5m."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], re.sub(r"\$(\w+)", lambda m: SUBSTITUTE.get(m[1], m[0]), target["expr"])))
    return out


def test_dashboard_panels_use_the_datasource_variable_and_cover_every_metric_family() -> None:
    dash = dashboard()
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/tide.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/tide.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(graphs) >= len(FAMILIES) // 2
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert set(variables) == {"datasource", "pool", "node", "queue", "job"}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "uid" not in json.dumps(dash).replace('"uid": "${datasource}"', "").replace('"uid": "tide-overview"', "")
    for name in ("pool", "node", "queue", "job"):
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", name
    assert "$pool" in variables["node"]["definition"]  # nodes of the chosen pools
    assert "hpc_job" in variables["job"]["definition"] and "$queue" in variables["job"]["definition"]
    exprs = " ".join(e for _, e in panel_queries())
    for family in FAMILIES:
        assert family in exprs, family
    assert "$" not in exprs


def test_rates_use_the_rate_interval_and_node_panels_follow_the_node_variable() -> None:
    raw = [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]
    rates = [(title, e) for title, e in raw if "rate(" in e]
    assert rates
    for title, expr in rates:
        windows = re.findall(r"\brate\([^\[]*\[([^\]]+)\]", expr)
        assert windows and set(windows) == {"$__rate_interval"}, title
    node_panels = 0
    for title, expr in raw:
        for metric, matchers in NODE_SERIES.findall(expr):
            label = "Hostname" if metric.startswith("DCGM_") else "node"
            assert f'{label}=~"$node"' in matchers, (title, metric)
            node_panels += 1
    assert node_panels >= 10


def test_a_row_repeats_per_job_over_the_dcgm_series_of_its_gpus() -> None:
    panels = dashboard()["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    job_rows = [i for i in rows if panels[i].get("repeat") == "job"]
    assert len(job_rows) == 1
    start = job_rows[0]
    end = next((i for i in rows if i > start), len(panels))
    body = panels[start + 1:end]
    assert "$job" in panels[start]["title"] and len(body) >= 2
    for panel in body:
        for target in panel["targets"]:
            assert 'hpc_job=~"$job"' in target["expr"], panel["title"]


def test_compose_mounts_the_provisioning_and_dashboards() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    volumes = " ".join(compose["services"]["grafana"]["volumes"])
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning" in volumes
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in volumes
    scrape = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["metrics:9464"]
