"""GPU telemetry under the names and labels of NVIDIA's dcgm-exporter, so its Grafana dashboards and
queries work on Tide's metrics endpoint unchanged.

Each series carries dcgm-exporter's entity labels ``gpu``, ``UUID``, ``device`` (``nvidia<i>``),
``modelName`` and ``Hostname`` (the node id), and, for a GPU that pods hold, the workload labels of its
Kubernetes mode: ``pod`` and ``namespace`` (the queue; Tide's own name ``queue`` too) plus ``hpc_job``
(its HPC mode's label for the job holding a GPU: ``job`` itself is Prometheus' scrape-job label, which a
target may not set). A GPU several pods share has one series per pod, as dcgm-exporter's shared-GPU
mode; a free GPU one series without workload labels. ``pool`` is added so Tide's ``$pool`` filter applies.

Values are in dcgm-exporter's units (percent, MiB, MHz, W, C). The module is pure: the service supplies
the current samples (``GpuView``) through a prometheus_client collector on the same registry it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from tide.schemas.events import GpuSample

from tide_metrics.state import Holder

MIB = 1024 * 1024
ENTITY_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pool")
WORKLOAD_LABELS = ("pod", "namespace", "queue", "hpc_job")


@dataclass(frozen=True)
class GpuView:
    """What the exporter knows of one GPU at scrape time."""

    node: str
    sample: GpuSample
    model: str = ""
    pool: str = ""
    holders: tuple[Holder, ...] = ()
    last_xid: int = 0  # the last XID error seen on it (0: none since the metrics service started)


@dataclass(frozen=True)
class Field:
    name: str
    help: str
    value: Callable[[GpuView], float]


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.sample.utilization_ratio * 100),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.sample.memory_bandwidth_ratio * 100),
    Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.sample.memory_used_bytes / MIB),
    Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
          lambda g: max(0, g.sample.memory_total_bytes - g.sample.memory_used_bytes) / MIB),
    Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sample.sm_clock_hz / 1e6),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.sample.power_watts),
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.sample.temperature_c),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
          lambda g: g.sample.ecc_uncorrected_errors),
    Field("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda g: g.last_xid),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus, in bytes per second.",
          lambda g: g.sample.pcie_tx_bytes_per_s),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus, in bytes per second.",
          lambda g: g.sample.pcie_rx_bytes_per_s),
    Field("DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data transmitted over NVLink, in bytes per second.",
          lambda g: g.sample.nvlink_tx_bytes_per_s),
    Field("DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data received over NVLink, in bytes per second.",
          lambda g: g.sample.nvlink_rx_bytes_per_s),
)


def label_sets(g: GpuView) -> list[dict[str, str]]:
    """The label sets of one GPU's series: one per holder, or one without workload labels when free."""
    entity = {"gpu": str(g.sample.index), "UUID": g.sample.uuid, "device": f"nvidia{g.sample.index}",
              "modelName": g.model, "Hostname": g.node, "pool": g.pool}
    if not g.holders:
        return [entity]
    return [{**entity, "pod": h.pod, "namespace": h.queue, "queue": h.queue, "hpc_job": h.job}
            for h in g.holders]


def families(gpus: Iterable[GpuView]) -> list[GaugeMetricFamily]:
    """Every field as a gauge family (dcgm-exporter declares the ECC total a counter; the values are the
    same, and a gauge keeps the name without a ``_total`` suffix)."""
    views = list(gpus)
    labelled = [(g, label_sets(g)) for g in views]
    out = []
    for f in FIELDS:
        family = GaugeMetricFamily(f.name, f.help, labels=[*ENTITY_LABELS, *WORKLOAD_LABELS])
        for g, sets in labelled:
            value = float(f.value(g))
            for labels in sets:
                family.add_metric([labels.get(k, "") for k in (*ENTITY_LABELS, *WORKLOAD_LABELS)], value)
        out.append(family)
    return out


class DcgmCollector(Collector):
    """A prometheus_client collector: ``views`` is called at every scrape."""

    def __init__(self, views: Callable[[], Iterable[GpuView]]) -> None:
        self.views = views

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from families(self.views())

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The names, without reading any GPU (the registry asks when the collector is registered)."""
        yield from families([])
