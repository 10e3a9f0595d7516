"""What a process can offer and what it uses: free device memory and resident set size."""
from __future__ import annotations

import ctypes
import os
import time
import resource

import torch

from peers.base.limits import CUDA_MARGIN, size
from peers.compute.runtime import RUNTIME


def free_bytes(device: str) -> int:
    """What this process can offer the ring: free VRAM less a margin for the CUDA context, or available RAM."""
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return max(free - CUDA_MARGIN, 0)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of this process (or of `pid`)."""
    with open(f"/proc/{pid or os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def usage(device: str) -> tuple[int, int]:
    """(now, peak) bytes this member uses: the device's allocated tensors on CUDA, the resident set on the CPU."""
    if device.startswith("cuda") and torch.cuda.is_available():
        d = torch.device(device)
        return torch.cuda.memory_allocated(d), torch.cuda.max_memory_allocated(d)
    now = rss_bytes()
    # the peak of this process's own memory map (VmHWM), not ru_maxrss: that one is carried over from the parent
    # through exec, and a peer started by a large process would report the parent's peak as its own. Either is
    # sampled by the kernel at its own moments and can trail the resident set just read.
    return now, max(now, peak_rss_bytes())


def reset_peak(device: str) -> None:
    """Count the peak from now on: a host started in a process that did other work first (bench's baseline model,
    a test) reports what the ring costs it, not what came before."""
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(torch.device(device))
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: VmHWM back to the resident set now
    except OSError:
        pass


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no /proc: the rusage peak


def release_freed() -> None:
    """Hand memory freed on the heap back to the OS. glibc keeps it otherwise, and a loader that frees a
    full-precision tensor for each one it quantizes would grow by the fragments."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def give_back(device: str) -> None:
    """Once a re-plan has dropped a shard: its memory back to the system before the next one is loaded. glibc keeps
    freed tensors in the heap of the thread that allocated them (a host whose loads ran on different worker threads
    grew by a shard per re-plan), and CUDA's caching allocator keeps freed blocks that the next plan's free memory
    would not count."""
    release_freed()
    if device.startswith("cuda"):
        RUNTIME.empty_cache()


def _libc():
    return ctypes.CDLL("libc.so.6")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def is_oom(e: BaseException) -> bool:
    """An allocator that could not allocate: CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def oom_line(who: str, device: str, doing: str) -> str:
    """One line for the host and the user: who ran out, doing what, with its numbers."""
    if device.startswith("cuda"):
        RUNTIME.empty_cache()  # what the failed step held goes back before free memory is read
    now, peak = usage(device)
    return (f"{who} ran out of memory on {device} {doing} ({size(now)} in use, peak {size(peak)}, "
            f"{size(free_bytes(device))} free)")


def injected_failure(who: str, stage: str, device: str) -> None:
    """Tests only: SFCHAT_TEST_OOM=NAME:STAGE (load or pass) has member NAME ask its device's allocator for a
    pebibyte at that stage, so a real allocation failure travels the real path; SFCHAT_TEST_BREAK=NAME:STAGE has
    it fail there as a file that cannot be read would."""
    if os.environ.get("SFCHAT_TEST_OOM") == f"{who}:{stage}":
        torch.empty(1 << 50, dtype=torch.uint8, device=device)
    if os.environ.get("SFCHAT_TEST_BREAK") == f"{who}:{stage}":
        raise OSError(f"injected failure {who}:{stage} (SFCHAT_TEST_BREAK)")


def injected_slowness(who: str, passes: int) -> None:
    """Tests only: SFCHAT_TEST_SLOW=NAME:AFTER:SECONDS has member NAME take SECONDS more over each pass after its
    first AFTER, as when another program takes its cores."""
    name, _, rest = os.environ.get("SFCHAT_TEST_SLOW", "").partition(":")
    if name == who and rest:
        after, seconds = rest.split(":")
        if passes >= int(after):
            time.sleep(float(seconds))


def pick_dtype(name: str, device: str) -> str:
    """`auto`: bfloat16 on a CUDA device that computes in it (compute capability 8+), float16 on older CUDA
    devices; on a CPU bfloat16 where it multiplies bfloat16 natively (cpu_bf16), else float32 (where half
    precision is emulated: slower than float32, and less exact); any other name as given."""
    if name != "auto":
        return name
    if not str(device).startswith("cuda"):
        return "bfloat16" if cpu_bf16() else "float32"
    return "bfloat16" if torch.cuda.get_device_capability(torch.device(device))[0] >= 8 else "float16"


def cpu_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), as oneDNN does then. SFCHAT_CPU_DTYPE
    (float32 or bfloat16) overrides what `auto` takes on a CPU (the test suite pins float32 with it)."""
    pinned = os.environ.get("SFCHAT_CPU_DTYPE")
    if pinned in ("float32", "bfloat16"):
        return pinned == "bfloat16"
    try:
        with open(cpuinfo) as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def module_bytes(module: torch.nn.Module) -> int:
    """What a loaded module holds: parameters, buffers and the plain tensors a quantized linear keeps."""
    seen, total = set(), 0
    for m in module.modules():
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False),
                  *(v for v in vars(m).values() if isinstance(v, torch.Tensor))]:
            if id(t) not in seen and t.device.type != "meta":
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total
