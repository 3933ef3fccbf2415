"""The memory a node could give a process now, without importing mlx (the worker reports it too)."""

from __future__ import annotations

import os


def memory_available_bytes() -> int:
    """Linux: MemAvailable (free memory plus what the kernel can reclaim); elsewhere: physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
