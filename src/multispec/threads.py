"""CPU thread defaults: torch's default (one thread per core) stalls badly when other processes share the cores,
because its worker threads wait on each other at every op (10-38x slower for the default pair on a busy 2-core
machine). The default here takes the cores this process may use, minus the ones other work keeps busy, at most 4.

The CLI applies it (`set_threads`, `--threads N` overrides); the library applies it when a pair loads
(`apply_library_default`), unless the user chose the threads already: OMP_NUM_THREADS / MKL_NUM_THREADS set, or
torch's thread count changed from torch's own default.
"""
from __future__ import annotations

import os

MAX_DEFAULT_THREADS = 4  # small models gain little beyond this, and fewer threads stall less under load
MIN_THREAD_LIMIT = 64  # --threads above max(this, 4 x the machine's cores) is refused: OpenMP would try to start them


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's cpuset), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cores() -> float:
    """How many cores other work keeps busy: the larger of the 1-minute load average and the processes runnable
    right now (/proc/loadavg's 4th field, minus this one; the load average lags a newly started job by a minute)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0]) - 1
    except (OSError, IndexError, ValueError):
        running = 0
    return max(load, float(running))


def default_threads() -> tuple[int, str | None]:
    """(threads, warning or None): min(available cores, 4), less the busy cores, at least 1; a warning when the
    machine is oversubscribed (busy cores >= available cores)."""
    cores = available_cores()
    busy = busy_cores()
    threads = max(1, min(cores, MAX_DEFAULT_THREADS, cores - int(busy + 0.5)))
    warning = None
    if busy >= cores:
        warning = (f"the machine is busy (load {busy:.1f} on {cores} cores): using {threads} torch thread; "
                   "expect slower generation (set --threads to override)")
    return threads, warning


def thread_limit() -> int:
    """The most torch threads a run may ask for: 4 x the machine's cores, at least MIN_THREAD_LIMIT."""
    return max(MIN_THREAD_LIMIT, 4 * (os.cpu_count() or 1))


def check_thread_count(threads: int) -> int:
    """threads, or a one-line MultispecError when it is more than thread_limit() (100,000 OpenMP threads fail to
    map their stacks: a crash inside torch, not an answer)."""
    from multispec.errors import check

    check(threads <= thread_limit(), f"--threads {threads} is more than this machine can run "
          f"({os.cpu_count() or 1} cores; at most {thread_limit()})")
    return threads


def set_threads(threads: int | None) -> tuple[int, str | None]:
    """Set torch's CPU threads: `threads` when given, else `default_threads()`. Returns (threads, warning): the
    default's busy-machine warning, or a warning when `threads` is more than the cores this process may use."""
    import torch

    warning = None
    if threads is None:
        threads, warning = default_threads()
    elif check_thread_count(threads) > available_cores():
        warning = (f"{threads} torch threads on {available_cores()} cores: threads beyond the cores wait on each "
                   "other at every op (often several times slower); use at most the cores, or leave --threads out")
    torch.set_num_threads(threads)
    _CHOSEN[:] = [threads]
    return threads, warning


_CHOSEN: list[int] = []  # the thread count set_threads chose last in this process (empty: none yet)
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def torch_default_threads() -> int:
    """The thread count torch starts with when no environment variable sets it: its physical cores among those
    this process may use (sysfs topology), else the available cores."""
    cores = set()
    try:
        for cpu in os.sched_getaffinity(0):
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_id") as f:
                core = f.read().strip()
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id") as f:
                cores.add((f.read().strip(), core))
    except (AttributeError, OSError):
        return available_cores()
    return len(cores) or available_cores()


def apply_library_default() -> int | None:
    """For the library (load_pair): set the CLI's default thread count unless the user chose one already (an
    environment variable above, torch's count changed from torch's default) or set_threads ran. Returns the count
    set, or None when left alone."""
    import torch

    if _CHOSEN or any(os.environ.get(name) for name in _THREAD_ENV):
        return None
    if torch.get_num_threads() != torch_default_threads():
        return None
    threads, _ = set_threads(None)
    return threads


def available_ram() -> int | None:
    """Bytes of RAM free for new work now: Linux's MemAvailable, else the physical RAM; None when neither can be
    read (the server's cache budget, serve/memory.py, and the packed weights' copies, models/rows.py)."""
    try:
        with open("/proc/meminfo") as f:
            return 1024 * next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such names on this system
        return None
