"""The kernels the DRAM level describes, by name (``KERNELS``): each one's grids, occupancy source and options.

The kernels of ``kernels/`` are described as they are now, their blocks per SM read from the committed resource
report (``iosim.gpu.occupancy``); the kernels an earlier GPU run measured stay available under a dated name
(``iosim.gpu.call1``), so that its predictions can be reproduced. ``default_kernel`` is the one a request of an
algorithm gets when it names none; ``iosim kernels`` lists them all with their sources.
"""

from __future__ import annotations

from dataclasses import replace

from iosim.core.errors import InputError
from iosim.core.gpus import GPUS
from iosim.core.units import FP8_DTYPES
from iosim.gpu import call1
from iosim.gpu.grids import _device, fa3, fa3_backward, flash, flash_swapped, flash_swapped_tc, sdpa_flash, split_kv
from iosim.gpu.kernel import Kernel, Launch, code, measured
from iosim.gpu.l2 import Grid


def with_code(grid: Grid, kernel: str, part: str, launch: Launch, one_build: bool = False,
              any_dtype: bool = False) -> Grid:
    """``grid`` with the code bytes of exactly its build, from the resource report's sm_90 cubins
    (``iosim.gpu.kernel.code``; None where the report did not compile it)."""
    return replace(grid, code_bytes=code(kernel, part, launch, one_build, any_dtype))


def with_codes(grids: tuple[Grid, ...], codes: tuple[int, ...]) -> tuple[Grid, ...]:
    """Each of ``grids`` with its kernel's code bytes."""
    return tuple(replace(g, code_bytes=c) for g, c in zip(grids, codes, strict=True))


def backward_device_kernels(launch: Launch, main: Grid) -> tuple[Grid, ...]:
    """flash-swapped's backward launch: row_dot, fill, the main kernel, and in a dtype narrower than float32 the cast
    of dQ; the grid-stride kernels at the report's blocks per SM (one build of each stands for every dtype) and with
    the code of their own builds."""
    parts = ("row_dot", "fill", "main", "cast")
    per_sm = [measured(k, k, launch, None, any_dtype=True) for k in parts if k != "main"]
    # the fill is of dQ's float32 accumulator whatever the dtype; row_dot and the cast have a build per dtype
    return tuple(g if k == "main" else with_code(g, k, k, launch, one_build=True, any_dtype=k == "fill")
                 for k, g in zip(parts, _device.around(launch.problem, main, *per_sm)))


def _flash(launch: Launch) -> tuple[Grid, ...]:
    pb, t = launch.problem, launch.tiling
    if launch.backward:
        grid = flash.backward(pb, t, measured("flash", "backward", launch, flash.backward_smem(pb, t)))
        return (with_code(grid, "flash", "backward", launch),)
    grid = flash.forward(pb, t, measured("flash", "forward", launch, flash.forward_smem(pb, t)))
    return (with_code(grid, "flash", "forward", launch),)


def _flash_swapped(launch: Launch) -> tuple[Grid, ...]:
    pb, t = launch.problem, launch.tiling
    if launch.backward:
        main = flash_swapped.backward(pb, t, measured("flash-swapped", "backward", launch,
                                                      flash_swapped.backward_smem(pb, t)))
        return backward_device_kernels(launch, with_code(main, "flash-swapped", "backward", launch))
    per_sm = measured("flash-swapped", "forward", launch, flash_swapped.forward_smem(pb, t))
    grid = flash_swapped.forward(pb, t, per_sm, sawtooth=launch.sawtooth)
    return (with_code(grid, "flash-swapped", "forward", launch),)


def _flash_swapped_tc(launch: Launch) -> tuple[Grid, ...]:
    pb, t = launch.problem, launch.tiling
    if pb.dtype == "float32":  # the tensor-core kernels are 16-bit: float32 runs flash-swapped's
        return _flash_swapped(launch)
    bound = flash_swapped.backward_smem(pb, t) if launch.backward else flash_swapped.forward_smem(pb, t)
    part = "backward" if launch.backward else "forward"
    per_sm = measured("flash-swapped-tc", part, launch, bound)
    if launch.backward:
        main = with_code(flash_swapped_tc.backward(pb, t, per_sm), "flash-swapped-tc", part, launch)
        return backward_device_kernels(launch, main)
    return (with_code(flash_swapped_tc.forward(pb, t, per_sm), "flash-swapped-tc", part, launch),)


def _split_kv(launch: Launch) -> tuple[Grid, ...]:
    """The split kernel, then the combine where there is more than one split."""
    pb, t = launch.problem, launch.tiling
    grid = with_code(split_kv.split(pb, t, measured("split-kv", "split", launch, split_kv.split_smem(pb, t))),
                     "split-kv", "split", launch)
    if t.splits == 1:
        return (grid,)
    # the combine holds no tile in shared memory: the report's build (48 registers at d = 64 and 128) stands for every
    # dtype and d
    combine = split_kv.combine(pb, t, measured("split-kv", "combine", launch, None, any_dtype=True, any_d=True))
    return grid, with_code(combine, "split-kv", "combine", launch, one_build=True)


def _sdpa_flash(launch: Launch) -> tuple[Grid, ...]:
    """torch SDPA's flash backend: the forward's one kernel where torch runs it unsplit, else its split-KV kernel and
    the combine; the backward's three."""
    pb, t = launch.problem, launch.tiling
    if launch.backward:
        if pb.shape.kv_heads != pb.shape.heads:  # torch then sums dK, dV over each group: two kernels more
            raise InputError(f"kv_heads={pb.shape.kv_heads} < heads={pb.shape.heads} in the backward: torch sums dK "
                             "and dV over each group after FlashAttention-2's kernels, which the description does "
                             "not hold; allowed: kv_heads == heads")
        dot, main, convert = sdpa_flash.backward_bounds(pb, t)
        grids = (sdpa_flash.dot_do_o(pb, t, dot), sdpa_flash.backward_main(pb, t, main),
                 sdpa_flash.convert_dq(pb, t, convert))
        return with_codes(grids, sdpa_flash.code(pb, t, sdpa_flash.backward_builds(pb, t)))
    if launch.sms is None:
        raise ValueError("sdpa-flash's forward needs the GPU's SMs (Launch.sms) to know whether torch splits K/V")
    splits = sdpa_flash.forward_splits(pb.shape, launch.sms)
    if splits > 1:  # FlashAttention-2's split-KV kernels, at their own tile (sdpa_flash.tile with the SMs)
        split, merge = sdpa_flash.split_bounds(pb, t, splits)
        grids = sdpa_flash.split_forward(pb, t, splits, split), sdpa_flash.combine(pb, splits, merge)
        return with_codes(grids, sdpa_flash.code(pb, t, sdpa_flash.split_builds(pb, t, splits)))
    grids = (sdpa_flash.forward(pb, t, sdpa_flash.forward_bound(pb, t)),)
    return with_codes(grids, sdpa_flash.code(pb, t, sdpa_flash.forward_builds(pb, t)))


def _fa3(launch: Launch) -> tuple[Grid, ...]:
    """FlashAttention-3's forward: one persistent kernel where it runs unsplit and unpacked; its backward's three."""
    if launch.backward:
        return fa3_backward.grids(launch.problem, launch.tiling)
    fa3.check_launch(launch.problem, launch.sms)
    return (fa3.forward(launch.problem, launch.tiling),)


FA3 = "FlashAttention-3 on sm_90 (github.com/Dao-AILab/flash-attention hopper/ at 0251105, read from its source: " \
      "iosim/gpu/grids/fa3.py, fa3_backward.py); forward: float16, bfloat16 or float8_e4m3, d up to 256 and its d_v " \
      "pairs, its own tiles, one persistent CTA per SM (MinBlocksPerMultiprocessor = 1), its static or L2-aware " \
      "causal order; backward: float16 or bfloat16, preprocess, main (one CTA per key block and SM, its LPT order " \
      "under a causal mask) and dQ's postprocess; its binary is not read, so its code is not counted"

SDPA = "torch's scaled_dot_product_attention, flash backend: FlashAttention-2's kernels as read from their source " \
       "(iosim/gpu/grids/sdpa_flash.py); 16-bit, d = 64 or 128, its own tiles; blocks per SM from the registers of " \
       "torch 2.14.1's sm_90 binary (iosim/gpu/sdpa_resources_sm90.json) and its shared memory, each kernel's code " \
       "from the same binary"

# Forward FLOP/s call 3 measured on an H100 at batch·heads 256, N 4,096, d 64 (experiments/results/call3.json, the
# gpu_bench records of experiments/results/gpu/call3/second and fourth): flash-swapped float32 20.59 TFLOP/s (its
# float16 build computes in float32 on the CUDA cores too: taken the same), flash-swapped-tc float16 168.4 (bfloat16
# taken the same), SDPA's flash forward 242.7
CUDA_CORE_RATE, TENSOR_CORE_RATE, SDPA_RATE = 20.59e12, 168.4e12, 242.7e12


def _tc_rate(pb) -> float:
    return CUDA_CORE_RATE if pb.dtype == "float32" else TENSOR_CORE_RATE


TODAY = "kernels/{module} as this repository builds it; blocks per SM from the resource report's registers, " \
        "shared memory and threads (iosim/gpu/kernels_resources_sm90.json) under the preset's limits, else as shared " \
        "memory allows; each kernel's code from the same report where " \
        "it compiled the build a pass runs"

def from_sm(low: tuple[int, int], high: tuple[int, int] = (99, 9)) -> tuple[str, ...]:
    """The GPU presets whose compute capability lies in [low, high]: those a kernel built for them runs on."""
    def cc(gpu) -> tuple[int, int]:
        major, minor = gpu.sm.compute_capability.split(".")
        return int(major), int(minor)

    return tuple(g.name for g in GPUS.values() if low <= cc(g) <= high)


# the tensor-core kernels' mma.sync.aligned.m16n8k16 with f16 or bf16 inputs needs sm_80 or later (kernels/_mma.py;
# PTX ISA, "Warp-level matrix multiply-accumulate instructions": .m16n8k16 with .f16 and .bf16 from sm_80)
TENSOR_CORE_SMS = from_sm((8, 0))
# torch runs its flash backend on sm_80 to sm_121 only (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
# check_flash_attention_hardware_support: check_sm_version<sm80, sm121>)
SDPA_SMS = from_sm((8, 0), (12, 1))

# the dtypes the kernels of kernels/ take (kernels.api: float32 and float16, and bfloat16 where a module's BFLOAT16)
OWN_DTYPES = ("float32", "float16")

KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("flash", "flash", TODAY.format(module="flash.py"), _flash, backward=True, forward_dram=flash.forward_dram,
           dtypes=OWN_DTYPES),
    Kernel("flash-swapped", "flash-swapped", TODAY.format(module="flash_swapped.py"), _flash_swapped, backward=True,
           forward_dram=flash_swapped.forward_dram, options=("sawtooth",), rate=lambda pb: CUDA_CORE_RATE,
           dtypes=OWN_DTYPES),
    Kernel("flash-swapped-tc", "flash-swapped", TODAY.format(module="flash_swapped_tc.py") +
           "; float32 runs flash-swapped's kernels", _flash_swapped_tc, backward=True, rate=_tc_rate,
           runs_on=TENSOR_CORE_SMS, dtypes=(*OWN_DTYPES, "bfloat16")),
    Kernel("split-kv", "split-kv", TODAY.format(module="split_kv.py"), _split_kv, backward=False, dtypes=OWN_DTYPES),
    Kernel("sdpa-flash", "flash-swapped", SDPA, _sdpa_flash, backward=True, forward_dram=sdpa_flash.forward_dram,
           tile=sdpa_flash.tile, rate=lambda pb: SDPA_RATE, runs_on=SDPA_SMS),
    Kernel("fa3", "flash-swapped", FA3, _fa3, backward=True, forward_dram=fa3.forward_dram, tile=fa3.tile,
           takes=("fp8", "d_v"), runs_on=("H100", "H200")),
    call1.FLASH, call1.FLASH_SWAPPED,
)}


def get_kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise InputError(f"kernel={name!r} is not one of {sorted(KERNELS)}")
    return KERNELS[name]


def default_kernel(algorithm: str) -> Kernel:
    """The kernel of ``kernels/`` named as the algorithm, which a request that names no kernel gets."""
    if algorithm not in KERNELS or KERNELS[algorithm].algorithm != algorithm:
        raise InputError(f"algorithm {algorithm!r} has no GPU kernel that the L2 model describes; allowed: "
                         f"{sorted({k.algorithm for k in KERNELS.values()})}")
    return KERNELS[algorithm]


def named_for(algorithm: str, kernel: str | None) -> str | None:
    """``kernel`` where it implements ``algorithm``, else None (the algorithm's default): a ``--kernel`` given to a
    command over several algorithms serves the rows of the one it implements."""
    return kernel if kernel is not None and get_kernel(kernel).algorithm == algorithm else None


def kernel_for(algorithm: str, kernel: str | None) -> Kernel:
    """The kernel a request of ``algorithm`` runs: ``kernel`` by name, which must implement it, or its default."""
    if kernel is None:
        return default_kernel(algorithm)
    found = get_kernel(kernel)
    if found.algorithm != algorithm:
        raise InputError(f"kernel={kernel!r} implements {found.algorithm!r}, not algorithm {algorithm!r}; allowed: "
                         f"{sorted(k.name for k in KERNELS.values() if k.algorithm == algorithm)}")
    return found


def no_build(algorithms: list[str], dtype: str, kernel: str | None = None, suggest: bool = True) -> str | None:
    """What a report over ``algorithms`` in ``dtype`` says where the kernels it runs (``kernel`` for the algorithm it
    implements, else each algorithm's own) have no build in that dtype, so their rows have no DRAM bytes, and (with
    ``suggest``, for a command that takes --kernel) which kernel has one; None where none lacks it. FP8 dtypes are
    left to the refusal that names them (check_launchable)."""
    if dtype in FP8_DTYPES:
        return None
    lacking = [a for a in algorithms if a in {k.algorithm for k in KERNELS.values()}
               and dtype not in (kernel_for(a, named_for(a, kernel)).dtypes or (dtype,))]
    if not lacking:
        return None
    built = sorted(k.name for k in KERNELS.values() if k.algorithm in lacking and dtype in (k.dtypes or ()))
    hint = f"; --kernel {' or '.join(built)} has one" if built and suggest else ""
    return (f"{dtype}: the kernels of {', '.join(lacking)} have no {dtype} build, so their rows have no DRAM bytes and "
            f"their times are from HBM bytes{hint}")
