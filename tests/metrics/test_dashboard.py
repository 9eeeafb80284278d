"""The Grafana dashboard and its provisioning: well-formed, every panel has a query on the provisioned
datasource, and every metric family of the issue has a panel (the live check is test_prometheus.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
    "tide_feedback_memory_multiplier", "tide_feedback_affinity",
]


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel, variables set to 'all'."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], re.sub(r"\$(pool|queue)\b", ".*", target["expr"])))
    return out


def test_dashboard_panels_use_the_provisioned_datasource_and_cover_every_metric_family() -> None:
    dash = json.loads(DASHBOARD.read_text())
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/tide.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/tide.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(graphs) >= len(FAMILIES) // 2
    for panel in graphs:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"pool", "queue"}
    exprs = " ".join(e for _, e in panel_queries())
    for family in FAMILIES:
        assert family in exprs, family
    assert "$" not in exprs


def test_compose_mounts_the_provisioning_and_dashboards() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    volumes = " ".join(compose["services"]["grafana"]["volumes"])
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning" in volumes
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards" in volumes
    scrape = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["metrics:9464"]
