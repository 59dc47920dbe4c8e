"""The kernels compile for sm_90: NVVM to PTX, then nvJitLink to a cubin.

The other kernel tests run under Numba's CUDA simulator, which neither type-checks a
kernel nor lowers it to PTX, so a kernel that cannot compile for a GPU passes them (a
float16 flash-swapped kernel once did). This test compiles, for a stand-in sm_90 device
(no GPU, only NVVM and nvJitLink, which the test extra brings: numba-cuda[cu13]), the
covering subset of the specialisations experiments/kernel_resources.py reports on: of
flash-swapped and flash-swapped-tc, forward and backward, every dtype (float32/float16,
float16/bfloat16 on tensor cores), head dim (64, 128) and causal+dropout setting at least
once (all settings at their first level, and all at their second); every standard matmul, flash kernel and
small kernel; split-kv's split kernel at one split count and its combine; the sawtooth forward at one d.
29 of the 71 kernels; a fault that needs two settings at once to show is left to
`python -m experiments.kernel_resources --check`, which compiles all 71.
A second test reads the tensor-core kernels' machine code with the static model
(nvdisasm, also in the test extra) and holds it to the kernels' own MMA counts.
The subset compiles in a few parts, one test each, so that both of CI's test workers
share it; the two kernels the static model compiles, as kernel_resources does, are
left to that test.

conftest.py has chosen the simulator for this process, so the compiling runs in a
subprocess with it off.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

from experiments import kernel_resources, kernel_static_model  # under the simulator here: only names are used

TIMEOUT_S = 600
STATIC_MODEL_ONLY = "d=64 fp16 ("  # the kernels test_the_static_model_reads_every_hmma_… compiles: tc, d = 64, float16


def compile_in_subprocess(*args: str) -> subprocess.CompletedProcess:
    """python ARGS run from the repository root, simulator off; skipped where NVVM or nvJitLink cannot be loaded."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING": "1"}
    r = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    if r.returncode == kernel_resources.TOOLCHAIN_MISSING:
        pytest.skip(f"no sm_90 toolchain: {r.stderr.strip()}")
    return r


def test_the_covering_kernels_hold_every_level_of_every_setting():
    """Of each family that varies in three two-level settings, the compiled subset holds every level of each."""
    families = {}
    for case in kernel_resources.cases():
        words = case.name.split()
        if words[0].startswith("flash-swapped"):
            d, dtype = words[2], words[3]
            settings = (dtype, d, "causal+dropout" in words)
            families.setdefault(" ".join(words[:2]), {})[settings] = case.covering
    assert sorted(families) == ["flash-swapped backward", "flash-swapped forward", "flash-swapped-tc backward",
                                "flash-swapped-tc forward"], sorted(families)
    for family, chosen in families.items():
        assert len(chosen) == 8 and sum(chosen.values()) == 2, (family, chosen)
        compiled = [settings for settings, covering in chosen.items() if covering]
        for a in range(3):
            missing = {settings[a] for settings in chosen} - {settings[a] for settings in compiled}
            assert not missing, f"{family}: setting {a} never compiled at {missing}"
    rest = [case.name for case in kernel_resources.cases() if not case.name.startswith("flash-swapped")]
    products = {
        case.name.split(" fp")[0]
        for case in kernel_resources.cases()
        if case.name.startswith("standard matmul") and case.covering
    }
    assert len(products) == 4, products
    # split-kv's split kernel differs between split counts only in that constant: one count, and both combines
    splits = [case for case in kernel_resources.cases() if case.name.startswith("split-kv split")]
    assert len(splits) > 2 and sum(case.covering for case in splits) == 1, [c.name for c in splits if c.covering]
    sawtooth = [case for case in kernel_resources.cases() if case.name.startswith("sawtooth")]
    assert len(sawtooth) == 2 and sum(case.covering for case in sawtooth) == 1, [c.name for c in sawtooth]
    assert all(case.covering for case in kernel_resources.cases() if case.name in rest
               and not case.name.startswith(("standard matmul", "split-kv split", "sawtooth"))), rest


@functools.cache
def static_model_compiles() -> frozenset[str]:
    """The kernels test_the_static_model_reads_every_hmma_of_the_tensor_core_steps compiles and assembles as
    kernel_resources does (before it reads their machine code), where nvdisasm is there for it to run."""
    try:
        if kernel_static_model.nvdisasm() is None:
            return frozenset()
    except ImportError:  # no cuda.pathfinder: no toolchain, and nothing compiles here either
        return frozenset()
    return frozenset(case.name for case in kernel_static_model.model_cases() if STATIC_MODEL_ONLY in case.name)


# The covering subset in parts: a kernel's part is the first of these its name starts with, else the last
COMPILE_PARTS = ["flash-swapped backward", "flash-swapped forward", "flash-swapped-tc", "the others"]


def compile_part(case) -> str:
    return next((part for part in COMPILE_PARTS[:-1] if case.name.startswith(part + " ")), COMPILE_PARTS[-1])


# kernel_resources' check over the cases named on the command line, as --check --covering runs it over its subset
CHECK_NAMED = """
import sys
from experiments import kernel_resources as kr

kr.require_toolchain()
named = set(sys.argv[1:])
chosen = [case for case in kr.cases() if case.name in named]
if len(chosen) != len(named):
    sys.exit(f"no such kernel: {sorted(named - {case.name for case in chosen})}")
kr.cases = lambda: chosen
sys.exit(kr.check(jobs=1))
"""


def part_names(part: str) -> list[str]:
    """The covering kernels a part compiles: those of its name the static model's test does not compile."""
    elsewhere = static_model_compiles()
    return [case.name for case in kernel_resources.cases()
            if case.covering and compile_part(case) == part and case.name not in elsewhere]


def test_the_parts_and_the_static_model_compile_the_covering_subset():
    assert all(part_names(part) for part in COMPILE_PARTS), {part: part_names(part) for part in COMPILE_PARTS}
    # what no part compiles, the static model's test does, the same way: the tensor-core forward and backward
    left = {case.name for case in kernel_resources.cases() if case.covering} - {
        name for part in COMPILE_PARTS for name in part_names(part)}
    assert left == static_model_compiles() and len(left) in (0, 2), left


@pytest.mark.parametrize("part", COMPILE_PARTS)
def test_the_covering_kernels_compile_for_sm90(part):
    names = part_names(part)
    r = compile_in_subprocess("-c", CHECK_NAMED, *names)
    if r.returncode != 0:
        pytest.fail(f"kernel_resources' check of {part} exited with status {r.returncode}\n{r.stdout}{r.stderr}",
                    pytrace=False)
    assert f"all {len(names)} kernel specialisations compile" in r.stdout, r.stdout


# A kernel that the simulator runs (its local array takes a run-time shape) but NVVM rejects,
# checked beside a kernel that compiles: --check's failure path, in seconds
BROKEN_BESIDE_GOOD = """
import sys
from numba import cuda, float32
from experiments import kernel_resources as kr

@cuda.jit
def local_array_of_runtime_shape(out, n):
    a = cuda.local.array(n, float32)
    a[0] = 1.0
    out[0] = a[0]

kr.require_toolchain()
good = kr.cases()[-1]
broken = kr.KernelCase("local array of run-time shape", local_array_of_runtime_shape,
                       (kr.arr(kr.F32, 1), kr.I64), 1, 0)
kr.cases = lambda: [good, broken]
sys.exit(kr.check(jobs=1))
"""


def test_check_fails_naming_the_kernel_that_does_not_compile():
    r = compile_in_subprocess("-c", BROKEN_BESIDE_GOOD)
    good = kernel_resources.cases()[-1].name
    assert r.returncode == 1, f"exit status {r.returncode}\n{r.stdout}{r.stderr}"
    assert f"ok      {good}\n" in r.stdout, r.stdout
    assert "FAILED  local array of run-time shape\n" in r.stdout, r.stdout
    summary = "1 of 2 kernel specialisations do not compile for sm_90:\n  local array of run-time shape\n"
    assert r.stdout.endswith(summary), r.stdout


# The one-warp probes of the tensor-core primitives that tests/test_kernels.py runs: call 4 found them failing to
# compile on the GPU while the simulator ran them (tests/warp_probes.py)
WARP_PROBES = """
import sys
from numba import cuda, types
from experiments import kernel_resources as kr
sys.path.insert(0, "tests")
import warp_probes
from iosim.kernels import _mma

kr.require_toolchain()
u32, f32 = kr.arr(types.uint32, 2), kr.arr(kr.F32, 2)
mma = (u32, u32, f32, f32, u32)
kr.cases = lambda: [
    kr.KernelCase("mma float16 probe", cuda.jit(warp_probes.mma_probe(_mma.mma_16816, _mma.pack_half2)), mma, 32, None),
    kr.KernelCase("mma bfloat16 probe", cuda.jit(warp_probes.mma_probe(_mma.mma_16816_bf16, _mma.pack_bfloat162)),
                  mma, 32, None),
    kr.KernelCase("ldmatrix probe", cuda.jit(warp_probes.ldmatrix_probe()), (u32, u32, u32), 32, None),
]
sys.exit(kr.check(jobs=1))
"""


def test_the_warp_probes_compile_for_sm_90():
    r = compile_in_subprocess("-c", WARP_PROBES)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}{r.stderr}"
    assert r.stdout.endswith("all 3 kernel specialisations compile for sm_90 (NVVM to PTX, nvJitLink to a cubin)\n"), (
        r.stdout)


def test_the_static_model_reads_every_hmma_of_the_tensor_core_steps(tmp_path):
    """The model's tensor-core step holds exactly the HMMAs a warp issues by construction, forward and backward.

    The first tensor-core forward left fragment loops rolled, and the model, counting a loop
    it could not read once, reported 24 HMMAs a step where a warp issues 32: a ceiling
    nobody could trust. Every loop inside the step must now be read (or unrolled away).
    """
    out = tmp_path / "model"
    r = compile_in_subprocess("-m", "experiments.kernel_static_model", "--only", STATIC_MODEL_ONLY, "--out", str(out))
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}{r.stderr}"
    rows = json.loads(out.with_suffix(".json").read_text())["kernels"]
    assert sorted(row["kernel"].split()[1] for row in rows) == ["backward", "forward"], [row["kernel"] for row in rows]
    for row in rows:
        step = row["step"]
        assert step["hmma"] == row["hmma_built"] and step["unresolved_loops"] == 0, (row["kernel"], step)


CODE_PROBE = """
import json, tempfile
from pathlib import Path
from experiments import kernel_resources as resources, kernel_static_model as model
case = next(c for c in resources.cases() if c.name == "fill fp32")
log, cubin = resources.assemble(resources.compile_ptx(case))
with tempfile.TemporaryDirectory() as tmp:
    functions = model.parse_sass(model.disassemble(cubin, Path(tmp)))
print(json.dumps({**resources.code_sizes(cubin), "functions": [f.name for f in functions],
                  "listed": sum(f.instructions[-1].address + 16 for f in functions)}))
"""


def test_the_code_the_report_records_is_every_instruction_nvdisasm_lists():
    """kernel_resources' code bytes (read from the cubin's section headers) hold the machine code of the kernel and of
    every routine it calls, byte for byte as nvdisasm lists their instructions, 16 bytes each, beside the constant
    banks: fill's, whose whole read on an H100 is its code (experiments/results/code_bytes.md)."""
    if not static_model_compiles():
        pytest.skip("no nvdisasm (pip install -e '.[test]' brings nvidia-cuda-nvdisasm)")
    r = compile_in_subprocess("-c", CODE_PROBE)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}{r.stderr}"
    found = json.loads(r.stdout.splitlines()[-1])
    assert len(found["functions"]) >= 2, found  # the kernel and at least the 64-bit division it calls
    assert found["text_bytes"] == found["listed"] and found["constant_bytes"] > 0, found
    assert found["code_bytes"] == found["text_bytes"] + found["constant_bytes"]
