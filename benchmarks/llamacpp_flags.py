"""Which x86 instruction sets llama.cpp (the benchmark peer) is compiled for on this machine.

llama.cpp's default, ``GGML_NATIVE=ON``, compiles with ``-march=native``: for whatever the
CPU's CPUID reports, which is not what the operating system lets a process run. On an
Intel Xeon VM that reports AMX, a native build died with SIGILL (``tileloadd`` in
``libggml-cpu.so``) on its first request. So the peer is built with ``GGML_NATIVE=OFF`` and
each ``GGML_*`` instruction-set option chosen here:

- from ``/proc/cpuinfo``'s flags, which the kernel trims to what it enables (it hides AVX
  and AVX-512 flags whose register state XCR0 does not enable);
- for AMX, a listed ``amx_tile`` is not enough. A process must ask for tile state
  (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, which llama.cpp's
  ``ggml_amx_init`` does) and the OS must then let tile instructions run; and the compiler
  must keep ggml's tile configuration: on this project's Intel VM the OS runs tiles, but
  GCC 12.2 drops the stores that fill in ggml's config before ``ldtilecfg``, so the first
  ``tileloadd`` finds its tile unconfigured: SIGILL (seen in gdb: si_code ILL_ILLOPN, a #UD,
  after a successful ``arch_prctl``). ``probe_amx`` compiles and runs a small program that
  checks both: AMX is built in only when it runs.

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


# Each step says on stdout that it passed, so a crash tells which one failed.
PROBE_SOURCE = r"""
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

alignas(64) static int8_t data[16 * 64];

/* 1. The OS: tiles configured and loaded by hand (inline assembly, so no compiler choice
   can change what runs), on this thread and on a new one. */
static void *tiles_by_hand(void *arg) {
    alignas(64) unsigned char cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;   /* palette 1 */
    cfg[16] = 64; /* tile 0: 64 bytes a row */
    cfg[48] = 16; /* tile 0: 16 rows */
    __asm__ volatile("ldtilecfg %0" : : "m"(*cfg));
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm0" : : "r"(data), "r"((long)64) : "memory");
    __asm__ volatile("tilerelease");
    return arg;
}

/* 2. ggml: ggml_tile_config_init() as llama-cpp-python 0.3.36 has it
   (vendor/llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp), then a tile load as its kernels do. */
struct tile_config_t{
    uint8_t palette_id = 0;
    uint8_t start_row = 0;
    uint8_t reserved_0[14] = {0};
    uint16_t colsb[16] = {0};
    uint8_t rows[16] = {0};
};

inline void ggml_tile_config_init(void) {
    static thread_local bool done = false;

    if (done) {
        return;
    }

    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    tc.start_row = 0;
    tc.rows[0] = 8;   tc.colsb[0] = 64;
    tc.rows[1] = 8;   tc.colsb[1] = 64;
    tc.rows[2] = 16;  tc.colsb[2] = 32;
    tc.rows[3] = 16;  tc.colsb[3] = 32;
    tc.rows[4] = 16;  tc.colsb[4] = 64;
    tc.rows[5] = 16;  tc.colsb[5] = 64;
    tc.rows[6] = 16;  tc.colsb[6] = 64;
    tc.rows[7] = 16;  tc.colsb[7] = 64;

    _tile_loadconfig(&tc);
    done = true;
}

__attribute__((noinline)) static void tiles_as_ggml(void) {
    ggml_tile_config_init();
    _tile_loadd(0, data, 64);
    _tile_zero(4);
    _tile_release();
}

int main(void) {
    pthread_t worker;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        printf("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: %s\n", strerror(errno));
        return 3;
    }
    tiles_by_hand(NULL);
    if (pthread_create(&worker, NULL, tiles_by_hand, NULL) != 0 ||
        pthread_join(worker, NULL) != 0) {
        printf("pthread failed\n");
        return 4;
    }
    printf("os ok\n");
    fflush(stdout);
    tiles_as_ggml();
    printf("ggml ok\n");
    return 0;
}
"""
# how ggml's AMX code is compiled (-O3, and the -m flags its GGML_AVX512*/AMX options add)
PROBE_FLAGS = ["-O3", "-std=gnu++17", "-pthread", "-mavx512f", "-mavx512vnni",
               "-mamx-tile", "-mamx-int8"]  # fmt: skip


def probe_amx(cpu_flags: Iterable[str], cxx: str = "c++", timeout_s: float = 60.0) -> AmxProbe:
    """Whether AMX tile code, as ggml writes it and this C++ compiler compiles it, runs here
    (see the module docstring). Each of two steps has to pass:

    - the OS enables tile state: after ``arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`` (as
      llama.cpp's ``ggml_amx_init`` asks), hand-written tile instructions run;
    - the compiler keeps ggml's tile configuration: GCC 12.2 (Debian 12) at -O1 and above
      drops the rows/colsb stores of ``ggml_tile_config_init`` before ``ldtilecfg``, so the
      tiles stay unconfigured and the first ``tileloadd`` raises #UD (SIGILL).

    Not probed (off) unless cpuinfo lists ``amx_tile``; off without a C++ compiler or when it
    cannot compile AMX code (then it could not build ggml's either).
    """
    if "amx_tile" not in set(cpu_flags):
        return AMX_NOT_LISTED
    compiler = shutil.which(cxx)
    if compiler is None:
        return AmxProbe(False, f"not probed: no {cxx}")
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=timeout_s
    ).stdout.partition("\n")[0]
    with tempfile.TemporaryDirectory(prefix="amx-probe-") as tmp:
        source, binary = Path(tmp) / "probe.cpp", Path(tmp) / "probe"
        source.write_text(PROBE_SOURCE)
        built = subprocess.run(
            [compiler, *PROBE_FLAGS, "-o", str(binary), str(source)],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        if built.returncode != 0:
            return AmxProbe(False, f"probe did not compile ({version}): {built.stderr[-300:]}")
        ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=timeout_s)
    if ran.returncode == 0:
        return AmxProbe(True, f"ran: the OS enables tile state, {version} keeps ggml's config")
    how = (
        f"killed by {signal.Signals(-ran.returncode).name}"
        if ran.returncode < 0
        else (ran.stdout.strip().splitlines() or [f"exit status {ran.returncode}"])[-1]
    )
    if "os ok" in ran.stdout:
        return AmxProbe(False, f"the OS enables tile state, but ggml's tile config as {version} "
                        f"compiles it leaves the tiles unconfigured: {how}")  # fmt: skip
    return AmxProbe(False, f"tile instructions do not run here: {how}")
