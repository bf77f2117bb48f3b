"""The GPU peak table, the roofline arithmetic, and GPU telemetry picked for the right device."""

from __future__ import annotations

import pytest

from onnxaccel.bench.device_metrics import DeviceMonitor, physical_index
from onnxaccel.bench.gpu_specs import SPECS, lookup, peak_key
from onnxaccel.bench.roofline import ModelCost, roofline
from onnxaccel.target import parse_target


@pytest.mark.parametrize("reported,expected", [
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("NVIDIA L40S", "NVIDIA L40S"),
    ("Tesla T4", "NVIDIA T4"),
    ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ("AMD Instinct MI250X", "AMD Instinct MI250X (one GCD)"),
    ("AMD Instinct MI250", "AMD Instinct MI250 (one GCD)"),
    ("AMD Instinct MI210", "AMD Instinct MI210"),
    ("AMD Radeon PRO W7900", "AMD Radeon PRO W7900"),
    ("Radeon RX 7900 XTX", "AMD Radeon RX 7900 XTX"),
    ("NVIDIA GeForce GTX 1080", None),
    (None, None),
])
def test_device_names_as_drivers_report_them_find_their_spec(reported, expected):
    spec = lookup(reported)
    assert (spec.name if spec else None) == expected


def test_every_spec_cites_its_source_and_has_fp16_and_bandwidth():
    for spec in SPECS:
        assert spec.source and spec.peak("fp16") and spec.bandwidth_gbps > 0 and spec.peak("fp32")
        assert spec.peak("fp16") >= spec.peak("fp32")


def test_fp32_counts_tf32_on_nvidia_unless_turned_off():
    h200 = lookup("NVIDIA H200")
    assert peak_key("fp32", "cuda", {}, h200) == "tf32"
    assert peak_key("fp32", "cuda", {"use_tf32": "0"}, h200) == "fp32"
    assert peak_key("fp16", "cuda", {}, h200) == "fp16"
    assert peak_key("fp32", "migraphx", {}, lookup("MI300X")) == "fp32"
    assert peak_key("fp32", "cuda", {}, lookup("Tesla T4")) == "fp32"  # no TF32 units


def test_roofline_arithmetic():
    # ResNet-50 at batch 256: 8.18 GFLOP per image (torchvision), at 12,073 img/s FP16 on an H200
    cost = ModelCost(flops=int(8.18e9 * 256), param_bytes=102_000_000, activation_bytes=256 * 40_000_000,
                     io_bytes=256 * 602_112)
    roof = roofline(cost, seconds_per_inference=256 / 12_073, precision="fp16", device="cuda", options={},
                    spec=lookup("NVIDIA H200")).to_dict()
    assert roof["achieved_tflops"] == pytest.approx(8.18e9 * 12_073 / 1e12)
    assert roof["pct_of_peak"] == pytest.approx(100 * roof["achieved_tflops"] / 989.4)
    assert roof["ridge_flops_per_byte"] == pytest.approx(989.4e12 / 4.8e12)
    assert roof["bytes_estimate"] == int(102_000_000 * 0.5 + 2 * 256 * 40_000_000 * 0.5 + 256 * 602_112)
    assert roof["bound"] in ("compute", "memory") and roof["attainable_tflops"] <= 989.4
    assert roof["spec_source"].startswith("https://www.nvidia.com/")


def test_cpu_roofline_has_no_peak():
    roof = roofline(ModelCost(10**9, 10**6, 10**6, 10**3), seconds_per_inference=0.01, precision="fp32",
                    device="cpu", options={}, spec=None).to_dict()
    assert roof["achieved_tflops"] == pytest.approx(0.1) and roof["pct_of_peak"] is None and roof["bound"] is None


def test_visible_devices_map_runtime_ids_to_physical_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert physical_index(parse_target("cuda:1")) == ("nvidia", 5)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2")
    assert physical_index(parse_target("migraphx")) == ("amd", 2)
    assert physical_index(parse_target("cpu")) == (None, 0)


class FakeGpu:
    def __init__(self, gpu, vendor, name):
        self.gpu, self.vendor, self.name, self.samples = gpu, vendor, name, 3

    def to_dict(self):
        return {"utilization_pct": {"mean": 87.0, "peak": 99.0}, "memory_used_bytes": {"mean": 5e9, "peak": 6e9},
                "memory_total_bytes": 141e9, "power_w": {"mean": 400.0, "peak": 520.0},
                "temperature_c": {"mean": 50.0, "peak": 55.0}, "gfx_clock_mhz": {"mean": 1980.0, "peak": 1980.0}}


class FakeSummary:
    backends, notes, errors, interval_s = ["nvml"], [], [], 0.1

    def __init__(self, gpus):
        self.gpus = gpus

    def gpu(self, index, vendor=None):
        return next((g for g in self.gpus if g.gpu == index and vendor in (None, g.vendor)), None)


class FakeSampler:
    def __init__(self, interval):
        self.interval = interval

    def start(self):
        return self

    def stop(self):
        return FakeSummary([FakeGpu(0, "nvidia", "NVIDIA A100-SXM4-40GB"), FakeGpu(1, "nvidia", "NVIDIA H200")])


def test_monitor_reports_the_targets_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = DeviceMonitor(parse_target("cuda:1"), sampler_factory=FakeSampler)
    monitor.start()
    reading = monitor.stop()
    assert reading["name"] == "NVIDIA H200" and reading["utilization_pct"]["mean"] == 87.0
    assert reading["power_w"]["peak"] == 520.0 and reading["memory_used_bytes"]["peak"] == 6e9
    assert DeviceMonitor(parse_target("cpu"), sampler_factory=FakeSampler).snapshot() is None
    missing = DeviceMonitor(parse_target("cuda:7"), sampler_factory=FakeSampler).snapshot()
    assert missing["available"] is False and "no nvidia GPU 7" in missing["notes"][0]
