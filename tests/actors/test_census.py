"""actors.census: NVML when present, else CPU and system RAM; it never raises."""

from __future__ import annotations

import builtins
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from actors.census import take_census

GIB = 1 << 30

MEMINFO = """MemTotal:       24684084 kB
MemFree:        21251368 kB
MemAvailable:   22441880 kB
Buffers:          102400 kB
Cached:          1024000 kB
"""


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    return path


class BrokenNvml:
    """A pynvml stand-in whose init fails the way it does on a machine without a driver."""

    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


class FakeNvml:
    """Two GPUs; the first runs one of our engines and one foreign process."""

    def __init__(self) -> None:
        self.shutdown = False
        self.gpus = [
            {"name": b"NVIDIA H200", "total": 140 * GIB, "used": 30 * GIB, "util": 37},
            {"name": "NVIDIA L4", "total": 24 * GIB, "used": 0, "util": None},
        ]

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.1"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return self.gpus[handle]["name"]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        g = self.gpus[handle]
        return SimpleNamespace(total=g["total"], used=g["used"], free=g["total"] - g["used"])

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        util = self.gpus[handle]["util"]
        if util is None:
            raise RuntimeError("Not Supported")
        return SimpleNamespace(gpu=util, memory=10)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if handle:
            return []
        return [
            SimpleNamespace(pid=4242, usedGpuMemory=20 * GIB),
            SimpleNamespace(pid=777, usedGpuMemory=10 * GIB),
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        # The same compute process may be listed again, and some drivers cannot say how much it uses.
        if handle:
            return []
        return [SimpleNamespace(pid=4242, usedGpuMemory=20 * GIB), SimpleNamespace(pid=9, usedGpuMemory=None)]


def test_without_nvml_falls_back_to_system_memory(meminfo: Path) -> None:
    census = take_census(nvml=BrokenNvml(), meminfo=meminfo)
    assert census.source == "system" and census.gpus == []
    assert census.ram_total == 24684084 * 1024
    assert census.ram_available == 22441880 * 1024
    assert census.note and "NVML Shared Library Not Found" in census.note and "system RAM" in census.note
    memory = census.memory()
    assert memory.gpu_free == [] and memory.ram_available == census.ram_available


def test_without_the_package(monkeypatch: pytest.MonkeyPatch, meminfo: Path) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    census = take_census(meminfo=meminfo)
    assert census.source == "system"
    assert census.note and "nvidia-ml-py" in census.note


def test_this_machine_never_raises() -> None:
    # Whatever this machine has (here: no GPU driver), the census answers.
    census = take_census([1, 2, 3])
    assert census.ram_total > 0 and census.ram_available > 0
    assert census.cpu_count >= 1
    assert census.source in {"nvml", "system"}


def test_meminfo_without_available_and_missing_files(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 40 kB\n")
    census = take_census(nvml=BrokenNvml(), meminfo=old, cpuinfo=tmp_path / "none")
    assert census.ram_total == 1000 * 1024
    assert census.ram_available == 150 * 1024  # free + buffers + cache
    assert census.cpu_name is None
    # No /proc at all: sysconf answers instead.
    census = take_census(nvml=BrokenNvml(), meminfo=tmp_path / "missing")
    assert census.ram_total > 0


def test_garbage_meminfo(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"\xff\xfe not meminfo at all")
    census = take_census(nvml=BrokenNvml(), meminfo=junk)
    assert census.source == "system" and census.ram_total > 0  # from sysconf


def test_nvml_gpus_and_process_ownership(meminfo: Path) -> None:
    nvml = FakeNvml()
    census = take_census([4242], nvml=nvml, meminfo=meminfo)
    assert census.source == "nvml" and census.driver == "580.1" and census.note is None
    assert nvml.shutdown
    h200, l4 = census.gpus
    assert (h200.name, h200.uuid, h200.utilization) == ("NVIDIA H200", "GPU-0", 37)
    assert h200.free == 110 * GIB and h200.total == 140 * GIB
    assert {p.pid: (p.ours, p.used) for p in h200.processes} == {
        4242: (True, 20 * GIB),
        777: (False, 10 * GIB),
        9: (False, None),
    }
    assert h200.ours_used == 20 * GIB and h200.foreign_used == 10 * GIB
    assert l4.utilization is None and l4.processes == [] and l4.name == "NVIDIA L4"
    memory = census.memory()
    assert memory.gpu_free == [110 * GIB, 24 * GIB]
    assert memory.ram_available == 22441880 * 1024


def test_nvml_failing_midway_falls_back(meminfo: Path) -> None:
    nvml = FakeNvml()

    def broken(handle: int) -> Any:
        raise RuntimeError("GPU is lost")

    nvml.nvmlDeviceGetMemoryInfo = broken  # type: ignore[method-assign]
    census = take_census(nvml=nvml, meminfo=meminfo)
    assert census.source == "system" and "GPU is lost" in (census.note or "")
    assert nvml.shutdown  # NVML is shut down even when a call fails


def test_nvml_without_gpus(meminfo: Path) -> None:
    nvml = FakeNvml()
    nvml.gpus = []
    census = take_census(nvml=nvml, meminfo=meminfo)
    assert census.source == "system" and "found no GPU" in (census.note or "")
