"""The instruction sets llama.cpp is built for, chosen from CPU flags and the AMX probe.

INTEL_AMX is /proc/cpuinfo's flags on one of this project's machines (an Intel Xeon VM that
lists AMX: its kernel runs tiles for a process that asks, but GCC 12.2 miscompiles ggml's
tile config, so its probe fails); the other lists are typical of their CPU kinds, trimmed
to the flags that matter here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.llamacpp_flags import (
    AMX_NOT_LISTED,
    NEEDS,
    AmxProbe,
    choose_options,
    cmake_args,
    probe_amx,
    read_cpu_flags,
)


def flags(text: str) -> frozenset[str]:
    return frozenset(text.split())


INTEL_AMX = flags(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology "
    "nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic "
    "movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm "
    "3dnowprefetch cpuid_fault ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 "
    "avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
    "avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 "
    "wbnoinvd arat avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq rdpid bus_lock_detect cldemote movdiri movdir64b fsrm "
    "md_clear serialize tsxldtrk ibt amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d "
    "arch_capabilities"
)
AMD_ZEN3 = flags(
    "fpu sse sse2 ssse3 sse4_1 sse4_2 sse4a pclmulqdq fma cx16 movbe popcnt aes xsave avx f16c "
    "rdrand hypervisor abm misalignsse bmi1 avx2 bmi2 adx sha_ni xsaveopt xsavec clzero vaes "
    "vpclmulqdq rdpid fsrm"
)
AMD_ZEN4 = AMD_ZEN3 | flags(
    "avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi "
    "avx512_vbmi2 gfni avx512_vnni avx512_bitalg avx512_vpopcntdq"
)
# Sandy Bridge: AVX, but no AVX2, FMA, F16C or BMI2
INTEL_SANDY_BRIDGE = flags(
    "fpu sse sse2 ssse3 cx16 sse4_1 sse4_2 x2apic popcnt aes xsave avx lahf_lm pclmulqdq"
)
# a VM whose XCR0 leaves out the AVX state: the kernel lists no AVX-family flag at all
NO_AVX_STATE = flags("fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt aes bmi1 bmi2")

# PROBE_SIGILL is what the probe says on INTEL_AMX; the others, what it says where the OS
# refuses tile state and where the compiler keeps ggml's tile config
PROBE_SIGILL = AmxProbe(
    False,
    "the OS enables tile state, but ggml's tile config as c++ (Debian 12.2.0-14+deb12u1) "
    "12.2.0 compiles it leaves the tiles unconfigured: killed by SIGILL",
)
PROBE_REFUSED = AmxProbe(
    False,
    "tile instructions do not run here: "
    "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: Invalid argument",
)
PROBE_RAN = AmxProbe(True, "ran: the OS enables tile state, c++ 14 keeps ggml's config")
AMX = {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"}
AVX512_ALL = {"GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"}
AVX2_ERA = {"GGML_SSE42", "GGML_AVX", "GGML_F16C", "GGML_FMA", "GGML_BMI2", "GGML_AVX2"}


def on(options: dict[str, bool]) -> set[str]:
    return {name for name, value in options.items() if value}


def test_amd_zen3_gets_avx2_and_nothing_newer() -> None:
    assert on(choose_options(AMD_ZEN3, AMX_NOT_LISTED)) == AVX2_ERA


def test_amd_zen4_gets_avx512_but_not_avx_vnni_or_amx() -> None:
    assert on(choose_options(AMD_ZEN4, AMX_NOT_LISTED)) == AVX2_ERA | AVX512_ALL


def test_intel_listing_amx_whose_probe_fails_gets_avx512_without_amx() -> None:
    for probe in (PROBE_SIGILL, PROBE_REFUSED):
        chosen = choose_options(INTEL_AMX, probe)
        assert on(chosen) == AVX2_ERA | {"GGML_AVX_VNNI"} | AVX512_ALL, probe


def test_intel_whose_probe_ran_tiles_gets_amx() -> None:
    chosen = choose_options(INTEL_AMX, PROBE_RAN)
    assert on(chosen) == AVX2_ERA | {"GGML_AVX_VNNI"} | AVX512_ALL | AMX


def test_a_probe_that_ran_does_not_turn_on_what_cpuinfo_does_not_list() -> None:
    assert on(choose_options(AMD_ZEN3, PROBE_RAN)) == AVX2_ERA
    # AMX listed, but the kernel hid AVX-512 (its state off in XCR0): ggml's AMX kernels need it
    no_avx512 = frozenset(f for f in INTEL_AMX if not f.startswith("avx512"))
    assert on(choose_options(no_avx512, PROBE_RAN)) == AVX2_ERA | {"GGML_AVX_VNNI"}


def test_a_cpu_without_avx2_gets_sse_and_avx_only() -> None:
    assert on(choose_options(INTEL_SANDY_BRIDGE, AMX_NOT_LISTED)) == {"GGML_SSE42", "GGML_AVX"}


def test_without_the_avx_state_every_avx_option_is_off() -> None:
    # FMA and F16C are VEX-encoded: without the AVX state they fault too
    assert on(choose_options(NO_AVX_STATE | {"fma", "f16c"}, AMX_NOT_LISTED)) == {
        "GGML_SSE42",
        "GGML_BMI2",
    }


def test_cmake_args_are_portable_and_name_every_option() -> None:
    args = cmake_args(choose_options(AMD_ZEN3, AMX_NOT_LISTED))
    assert args[:2] == ["-DLLAVA_BUILD=OFF", "-DGGML_NATIVE=OFF"]
    # ggml turns SSE4.2 .. F16C on by default with GGML_NATIVE=OFF: each is given explicitly
    assert {a.split("=")[0].removeprefix("-D") for a in args[2:]} == set(NEEDS)
    assert "-DGGML_AVX512=OFF" in args and "-DGGML_AVX2=ON" in args
    assert args == cmake_args(dict(reversed(choose_options(AMD_ZEN3, AMX_NOT_LISTED).items())))


def test_amx_is_probed_only_when_listed_and_off_without_a_compiler() -> None:
    assert probe_amx(AMD_ZEN4, cxx="no-such-compiler") == AMX_NOT_LISTED
    probe = probe_amx(INTEL_AMX, cxx="no-such-compiler")
    assert not probe.runs and "no-such-compiler" in probe.detail


def fake_compiler(tmp_path: Path, probe_script: str) -> str:
    """A stand-in C++ compiler whose "probe" is ``probe_script`` (what the real probe does
    on machines that are not this one: an OS without tile state, a compiler that keeps
    ggml's tile config)."""
    compiler = tmp_path / "fake-c++"
    compiler.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "fake-c++ 1.0"; exit 0; fi\n'
        'while [ "$1" != -o ]; do shift; done\n'
        f"printf '#!/bin/sh\\n%s\\n' '{probe_script}' > \"$2\"; chmod +x \"$2\"\n"
    )
    compiler.chmod(0o755)
    return str(compiler)


def test_the_probe_tells_the_os_from_the_compiler(tmp_path: Path) -> None:
    ran = probe_amx(INTEL_AMX, cxx=fake_compiler(tmp_path, "echo os ok; echo ggml ok"))
    assert ran.runs and "fake-c++ 1.0 keeps ggml's config" in ran.detail
    miscompiled = probe_amx(INTEL_AMX, cxx=fake_compiler(tmp_path, "echo os ok; kill -ILL $$"))
    assert not miscompiled.runs
    assert "the OS enables tile state, but ggml's tile config" in miscompiled.detail
    assert miscompiled.detail.endswith("killed by SIGILL")
    no_tiles = probe_amx(INTEL_AMX, cxx=fake_compiler(tmp_path, "kill -ILL $$"))
    assert (
        not no_tiles.runs
        and no_tiles.detail == "tile instructions do not run here: killed by SIGILL"
    )
    refused = probe_amx(INTEL_AMX, cxx=fake_compiler(tmp_path, "echo arch_prctl failed; exit 3"))
    assert not refused.runs and refused.detail.endswith("arch_prctl failed")


def test_cpu_flags_are_those_every_cpu_lists(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: sse4_2 avx avx2 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: sse4_2 avx avx2\n\n"
    )
    assert read_cpu_flags(cpuinfo) == {"sse4_2", "avx", "avx2"}
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp\n")
    assert read_cpu_flags(cpuinfo) == {"fp", "asimd", "asimddp"}
    assert read_cpu_flags(tmp_path / "missing") == frozenset()


def test_the_probe_runs_here_and_says_what_happened() -> None:
    flags = read_cpu_flags()
    probe = probe_amx(flags)
    if "amx_tile" not in flags:
        assert probe == AMX_NOT_LISTED
    else:  # an answer from the real probe: ran, or which step failed
        assert probe.detail.startswith(("ran: ", "the OS enables", "tile instructions do not"))
    cxx = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout
    if "amx_tile" in flags and " 12.2.0" in cxx.partition("\n")[0]:
        # where this was seen: llama.cpp built with AMX by GCC 12.2 died with SIGILL on its
        # first request, though the OS runs tiles (a probe of the OS alone said "ran")
        assert not probe.runs, probe
