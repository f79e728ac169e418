"""Hardware census: GPUs through NVML when it is there, else the CPU and system RAM.

``take_census`` never raises. NVML (the ``nvidia-ml-py`` package, module ``pynvml``,
a default dependency) is imported lazily; without it (an install that left it out),
without a driver, or when a call fails, the census falls back to /proc/meminfo (then
``os.sysconf``) and says why in ``note``. GPU processes are split into ours and foreign by
the pid set passed in (the daemon's engine children).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec

from registry.fit import Memory

__all__ = ["Census", "Gpu", "GpuProcess", "ram_available", "take_census", "tree_rss"]


class GpuProcess(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    used: int | None
    """Bytes of GPU memory, when the driver reports it."""
    ours: bool


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    name: str
    uuid: str | None = None
    total: int
    used: int
    free: int
    utilization: int | None = None
    """Percent of time a kernel ran over the driver's last sample period."""
    processes: list[GpuProcess] = []

    @property
    def ours_used(self) -> int:
        return sum(p.used or 0 for p in self.processes if p.ours)

    @property
    def foreign_used(self) -> int:
        return sum(p.used or 0 for p in self.processes if not p.ours)


class Census(msgspec.Struct, frozen=True, kw_only=True):
    source: Literal["nvml", "system"]
    """Where the GPU side came from: NVML, or only the CPU and system RAM."""
    gpus: list[Gpu] = []
    driver: str | None = None
    cpu_name: str | None = None
    cpu_count: int = 0
    ram_total: int = 0
    ram_available: int = 0
    note: str | None = None

    def memory(self) -> Memory:
        """What a new engine could use: free VRAM per GPU and available RAM."""
        return Memory(ram_available=self.ram_available, gpu_free=[g.free for g in self.gpus])


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _meminfo(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(total, available) bytes from a /proc/meminfo-style file, or None."""
    try:
        fields: dict[str, int] = {}
        for line in Path(path).read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
                fields[key.strip()] = int(parts[0]) * scale
    except (OSError, UnicodeDecodeError):
        return None
    total = fields.get("MemTotal")
    if total is None:
        return None
    available = fields.get("MemAvailable")
    if available is None:
        # Kernels before 3.14: free plus what the page cache could give back.
        available = fields.get("MemFree", 0) + fields.get("Buffers", 0) + fields.get("Cached", 0)
    return total, available


def _sysconf_memory() -> tuple[int, int] | None:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    except (AttributeError, ValueError, OSError):
        return None


def _cpu_name(cpuinfo: str | os.PathLike[str]) -> str | None:
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    return None


def _processes(nvml: Any, handle: Any, ours: set[int]) -> list[GpuProcess]:
    seen: dict[int, GpuProcess] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            infos = getattr(nvml, getter)(handle)
        except Exception:
            continue
        for info in infos or []:
            pid = int(getattr(info, "pid", -1))
            used = getattr(info, "usedGpuMemory", None)
            # NVML reports "not available" (e.g. under some containers) as None or a huge sentinel.
            used_bytes = int(used) if isinstance(used, int) and 0 <= used < (1 << 62) else None
            if pid >= 0 and pid not in seen:
                seen[pid] = GpuProcess(pid=pid, used=used_bytes, ours=pid in ours)
    return list(seen.values())


def _gpus(nvml: Any, ours: set[int]) -> tuple[list[Gpu], str | None]:
    nvml.nvmlInit()
    try:
        driver: str | None
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:
                utilization = None
            try:
                uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = None
            gpus.append(
                Gpu(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=uuid,
                    total=int(mem.total),
                    used=int(mem.used),
                    free=int(mem.free),
                    utilization=utilization,
                    processes=_processes(nvml, handle, ours),
                )
            )
        return gpus, driver
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def tree_rss(pid: int, proc: str | os.PathLike[str] = "/proc") -> int | None:
    """Resident bytes of a process and all its descendants; None when it is gone."""
    root = Path(proc)
    total, stack, seen = 0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in (root / str(p) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
            for task in (root / str(p) / "task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            if p == pid:
                return None
    return total


def ram_available(meminfo: str | os.PathLike[str] = "/proc/meminfo") -> int | None:
    """Bytes of RAM the system can give a new process now (MemAvailable); None when unknown."""
    memory = _meminfo(meminfo) or _sysconf_memory()
    return memory[1] if memory else None


def take_census(
    our_pids: Iterable[int] = (),
    *,
    nvml: Any | None = None,
    meminfo: str | os.PathLike[str] = "/proc/meminfo",
    cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo",
) -> Census:
    """GPUs (through NVML) plus CPU and RAM; never raises.

    ``nvml`` is the ``pynvml`` module or a stand-in with the same functions; by
    default it is imported here, and its absence is not an error.
    """
    ours = {int(p) for p in our_pids}
    memory = _meminfo(meminfo) or _sysconf_memory() or (0, 0)
    base: dict[str, Any] = {
        "cpu_name": _cpu_name(cpuinfo),
        "cpu_count": os.cpu_count() or 0,
        "ram_total": memory[0],
        "ram_available": memory[1],
    }
    notes = [] if memory != (0, 0) else ["system memory is unknown (no /proc/meminfo, no sysconf)"]
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except Exception as exc:
            reason = "the nvidia-ml-py package is not installed" if isinstance(exc, ImportError) else str(exc)
            notes.insert(0, f"no GPU census ({reason}); showing CPU and system RAM")
            return Census(source="system", note="; ".join(notes), **base)
    try:
        gpus, driver = _gpus(nvml, ours)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        notes.insert(0, f"no GPU census (NVML: {reason}); showing CPU and system RAM")
        return Census(source="system", note="; ".join(notes), **base)
    if not gpus:
        notes.insert(0, "NVML found no GPU; showing CPU and system RAM")
        return Census(source="system", driver=driver, note="; ".join(notes), **base)
    return Census(source="nvml", gpus=gpus, driver=driver, note="; ".join(notes) or None, **base)
