"""The instruction sets llama.cpp is built for, chosen from CPU flags and the AMX probe.

The flag lists are what /proc/cpuinfo shows on such machines: INTEL_AMX is this project's
CI VM (an Intel Xeon that lists AMX; its kernel runs tiles only for a process that asks),
the others are typical of their CPU kinds, trimmed to the flags that matter here.
"""

from __future__ import annotations

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

INTEL_AMX = frozenset(
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
    "arch_capabilities".split()
)
AMD_ZEN3 = frozenset(
    "fpu sse sse2 ssse3 sse4_1 sse4_2 sse4a pclmulqdq fma cx16 movbe popcnt aes xsave avx f16c "
    "rdrand hypervisor abm misalignsse bmi1 avx2 bmi2 adx sha_ni xsaveopt xsavec clzero vaes "
    "vpclmulqdq rdpid fsrm".split()
)
AMD_ZEN4 = AMD_ZEN3 | frozenset(
    "avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi "
    "avx512_vbmi2 gfni avx512_vnni avx512_bitalg avx512_vpopcntdq".split()
)
# Sandy Bridge: AVX, but no AVX2, FMA, F16C or BMI2
INTEL_SANDY_BRIDGE = frozenset(
    "fpu sse sse2 ssse3 cx16 sse4_1 sse4_2 x2apic popcnt aes xsave avx lahf_lm pclmulqdq".split()
)
# a VM whose XCR0 leaves out the AVX state: the kernel lists no AVX-family flag at all
NO_AVX_STATE = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt aes bmi1 bmi2".split())

PROBE_SIGILL = AmxProbe(False, "killed by SIGILL")
PROBE_REFUSED = AmxProbe(False, "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: ...")
PROBE_RAN = AmxProbe(True, "ran")
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
    assert probe_amx(AMD_ZEN4, cc="no-such-compiler") == AMX_NOT_LISTED
    probe = probe_amx(INTEL_AMX, cc="no-such-compiler")
    assert not probe.runs and "no-such-compiler" in probe.detail


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
    assert probe.detail
    if "amx_tile" not in flags:
        assert probe == AMX_NOT_LISTED
