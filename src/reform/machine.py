"""What the benchmark ran on, how fast this machine multiplies matrices (the FLOP-efficiency yardstick), and
how much memory it has free."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch


def matmul_throughput(dtype: torch.dtype, device: torch.device, n: int = 2048, seconds: float = 1.5) -> float:
    """Best FLOP/s of an n x n x n matmul in ``dtype`` on ``device`` over ~``seconds`` of repeats: the
    practical peak the model's own matmuls are compared against."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best, end = 0.0, time.perf_counter() + seconds
    torch.mm(a, b)                                   # warm-up (kernel selection, page faults)
    while time.perf_counter() < end or best == 0.0:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def machine_info(device: torch.device) -> dict:
    info = {"cpu": cpu_name(), "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "platform": f"{platform.system()} {platform.machine()}",
            "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    flags = ""
    try:
        flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    except OSError:
        pass
    info["cpu_bf16"] = [f for f in ("amx_bf16", "avx512_bf16") if f in flags.split()]
    if device.type == "cpu":   # the vector ISA PyTorch's kernels run (AVX2 on an AVX512 CPU if capped)
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    # ISA caps for PyTorch, oneDNN and MKL: a run made under them is not the CPU's own speed
    capped = {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}
    if capped:
        info["isa_caps"] = capped
    return info


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` (CUDA: free GPU memory; CPU: MemAvailable), or None."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
