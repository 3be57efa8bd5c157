"""What every CPU benchmark records about the machine it ran on (imported by the scripts beside it)."""
import os
import platform
from datetime import datetime, timezone

import torch


def machine() -> str:
    "CPU model, cores and torch threads, in words."
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def load_average() -> float:
    "The one-minute load average (0 where the OS has none)."
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def utc_now() -> str:
    "The date and time of a run, as RESULTS.md records it."
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
