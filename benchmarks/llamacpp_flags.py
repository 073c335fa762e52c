"""Which x86 instruction sets llama.cpp (the benchmark peer) is compiled for on this machine.

llama.cpp's default, ``GGML_NATIVE=ON``, compiles with ``-march=native``: for whatever the
CPU's CPUID reports, which is not what the operating system lets a process run. On an
Intel Xeon VM that reports AMX, a native build died with SIGILL (``tileloadd`` in
``libggml-cpu.so``) on its first request. So the peer is built with ``GGML_NATIVE=OFF`` and
each ``GGML_*`` instruction-set option chosen here:

- from ``/proc/cpuinfo``'s flags, which the kernel trims to what it enables (it hides AVX
  and AVX-512 flags whose register state XCR0 does not enable);
- for AMX, a listed ``amx_tile`` is not enough: a process must ask for tile state
  (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) and the hypervisor must then
  let tile instructions run. ``probe_amx`` compiles and runs a tiny C program that does
  what llama.cpp's AMX path does (ggml-cpu/amx/amx.cpp asks for that permission before it
  uses tiles): AMX is built in only when the probe's tile instructions ran.

``choose_options`` is the pure part: CPU flags and the probe's result in, cmake options out.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# the five that ggml's GGML_AVX512 compiles for (-mavx512f -mavx512cd -mavx512vl ...)
AVX512 = frozenset({"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"})
AMX_PROBED = "amx probe"  # stands for "the AMX probe ran tile instructions" in NEEDS

# Each ggml option (vendor/llama.cpp/ggml/CMakeLists.txt of llama-cpp-python 0.3.36, the
# non-MSVC x86 branch of ggml/src/ggml-cpu/CMakeLists.txt) and the cpuinfo flags it needs.
# VEX-encoded extensions need the AVX state too (the kernel hides "avx" without it).
NEEDS: dict[str, frozenset[str]] = {
    "GGML_SSE42": frozenset({"sse4_2"}),
    "GGML_AVX": frozenset({"avx"}),
    "GGML_F16C": frozenset({"avx", "f16c"}),
    "GGML_FMA": frozenset({"avx", "fma"}),
    "GGML_BMI2": frozenset({"bmi2"}),
    "GGML_AVX2": frozenset({"avx", "avx2"}),
    "GGML_AVX_VNNI": frozenset({"avx", "avx2", "avx_vnni"}),
    "GGML_AVX512": AVX512,
    "GGML_AVX512_VBMI": AVX512 | {"avx512vbmi"},
    "GGML_AVX512_VNNI": AVX512 | {"avx512_vnni"},
    "GGML_AVX512_BF16": AVX512 | {"avx512_bf16"},
    # ggml's AMX kernels are compiled only with __AMX_INT8__ and __AVX512VNNI__
    "GGML_AMX_TILE": AVX512 | {"amx_tile", AMX_PROBED},
    "GGML_AMX_INT8": AVX512 | {"avx512_vnni", "amx_tile", "amx_int8", AMX_PROBED},
    "GGML_AMX_BF16": AVX512 | {"amx_tile", "amx_bf16", AMX_PROBED},
}


@dataclass(frozen=True)
class AmxProbe:
    """What running tile instructions in a fresh process did."""

    runs: bool  # ldtilecfg/tileloadd/tilerelease ran, on the main thread and on another
    detail: str  # what happened, for the build log: "ran", "SIGILL", "arch_prctl: ..."


AMX_NOT_LISTED = AmxProbe(False, "not listed in /proc/cpuinfo (not probed)")


def choose_options(cpu_flags: Iterable[str], amx: AmxProbe) -> dict[str, bool]:
    """Every option in ``NEEDS``, on when the CPU flags (and, for AMX, the probe) allow it.

    Every option is given explicitly: with ``GGML_NATIVE=OFF`` ggml turns SSE4.2, AVX,
    AVX2, BMI2, FMA and F16C on by default, whatever the CPU.
    """
    have = set(cpu_flags)
    if amx.runs:
        have.add(AMX_PROBED)
    return {option: needs <= have for option, needs in NEEDS.items()}


def cmake_args(options: dict[str, bool]) -> list[str]:
    """``-D`` arguments for a portable build with ``options`` (sorted, so they key a cache)."""
    args = ["-DLLAVA_BUILD=OFF", "-DGGML_NATIVE=OFF"]
    args += [f"-D{name}={'ON' if on else 'OFF'}" for name, on in sorted(options.items())]
    return args


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The flags every CPU lists (x86 ``flags``, Arm ``Features``); empty when unreadable."""
    per_cpu: list[set[str]] = []
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            per_cpu.append(set(value.split()))
    return frozenset(set.intersection(*per_cpu)) if per_cpu else frozenset()


PROBE_SOURCE = r"""
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static unsigned char data[16 * 64];

static void *tiles(void *arg) {
    unsigned char cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;   /* palette 1 */
    cfg[16] = 64; /* tile 0: 64 bytes a row */
    cfg[48] = 16; /* tile 0: 16 rows */
    __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm0" : : "r"(data), "r"((long)64) : "memory");
    __asm__ volatile("tilerelease");
    return arg;
}

int main(void) {
    pthread_t worker;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        printf("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: %s\n", strerror(errno));
        return 3;
    }
    tiles(NULL);
    /* llama.cpp runs its kernels on worker threads */
    if (pthread_create(&worker, NULL, tiles, NULL) != 0 || pthread_join(worker, NULL) != 0) {
        printf("pthread failed\n");
        return 4;
    }
    printf("ran\n");
    return 0;
}
"""


def probe_amx(cpu_flags: Iterable[str], cc: str = "gcc", timeout_s: float = 60.0) -> AmxProbe:
    """Whether this process's OS lets AMX tile instructions run (see the module docstring).

    Not probed (off) unless cpuinfo lists ``amx_tile``; off when there is no C compiler or
    its assembler does not know the tile instructions (it could not build ggml's AMX code).
    """
    if "amx_tile" not in set(cpu_flags):
        return AMX_NOT_LISTED
    compiler = shutil.which(cc)
    if compiler is None:
        return AmxProbe(False, f"not probed: no {cc}")
    with tempfile.TemporaryDirectory(prefix="amx-probe-") as tmp:
        source, binary = Path(tmp) / "probe.c", Path(tmp) / "probe"
        source.write_text(PROBE_SOURCE)
        built = subprocess.run(
            [compiler, "-O0", "-pthread", "-o", str(binary), str(source)],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        if built.returncode != 0:
            return AmxProbe(False, f"probe did not compile: {built.stderr.strip()[-300:]}")
        ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=timeout_s)
    if ran.returncode == 0:
        return AmxProbe(True, "ran")
    if ran.returncode < 0:
        return AmxProbe(False, f"killed by {signal.Signals(-ran.returncode).name}")
    return AmxProbe(False, ran.stdout.strip() or f"exit status {ran.returncode}")
