"""GPU presets and the roofline estimate they give: declarative data, each number with its source.

A preset sets the SRAM capacity M (one SM's shared memory, in elements of the run's
dtype) and turns a run's bytes and FLOPs into a time:

    T = max(matmul FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth)

and which of the two bounds it. This is a lower bound on the time a kernel takes: it
assumes every SM busy and every byte moved at full bandwidth, and ignores occupancy,
the L2 cache (which may serve some re-reads without HBM traffic, the one way a real
kernel can beat it), latency, launch overheads, synchronization, the exponentials and
other elementwise work (they run off the tensor cores), and the overlap a kernel fails
to get between loading and computing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from iosim.core.errors import InputError
from iosim.core.flops import Flops
from iosim.core.units import DTYPE_ITEMSIZE, FP8_DTYPES, parse_size

KiB = 1024


@dataclass(frozen=True)
class Spec:
    """One number of a preset and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class SMLimits:
    """What one SM of a compute capability holds at once, whatever the kernel: the most resident thread blocks and
    threads, the shared memory the driver keeps back from each block (the SM's shared memory less the most one
    block may take), and the unit a block's shared memory, reserve included, is allocated in."""

    compute_capability: str  # the device's, where the table's column covers several (12.x)
    blocks: int
    threads: int
    reserved_per_block: int  # bytes
    smem_unit: int  # bytes
    source: str


# CUDA Programming Guide (CUDA 13), section 5.1 "Compute Capabilities", table 30: "Maximum number of resident blocks
# per SM" and "Maximum number of resident threads per SM"; cuda_occupancy.h's cudaOccMaxBlocksPerMultiprocessor (the
# CUDA runtime's occupancy calculator) hard-codes the same block limits
# CUDA 13's cuda_occupancy.h, cudaOccSMemAllocationGranularity: a block's shared memory and the reserve are allocated
# together, rounded up to 256 B at compute capability 7.x and 128 B at 8 to 12 (cudaOccMaxBlocksPerSMSmemLimit)
PROGRAMMING_GUIDE = "CUDA Programming Guide (CUDA 13), 5.1 Compute Capabilities, table 30"
GRANULARITY = "cuda_occupancy.h (CUDA 13), cudaOccSMemAllocationGranularity"
CC_7_5 = SMLimits("7.5", 16, 1024, 0, 256, f"{PROGRAMMING_GUIDE}: 16 blocks, 1,024 threads; 64 KB of shared memory "
                  f"per SM and per block (no reserve); {GRANULARITY}: allocated in 256 B units")
CC_8_0 = SMLimits("8.0", 32, 2048, 1024, 128, f"{PROGRAMMING_GUIDE}: 32 blocks, 2,048 threads; 164 KB per SM, 163 KB "
                  f"per block; {GRANULARITY}: allocated in 128 B units")
CC_9_0 = SMLimits("9.0", 32, 2048, 1024, 128, f"{PROGRAMMING_GUIDE}: 32 blocks, 2,048 threads; 228 KB per SM, 227 KB "
                  f"per block; {GRANULARITY}: allocated in 128 B units")
CC_10_0 = SMLimits("10.0", 32, 2048, 1024, 128, f"{PROGRAMMING_GUIDE}: 32 blocks, 2,048 threads; 228 KB per SM, "
                   f"227 KB per block; {GRANULARITY}: allocated in 128 B units")
# the Blackwell tuning guide says 32 blocks for 12.0; the programming guide, cuda_occupancy.h ("case 12: 24") and
# the cudaDevAttrMaxBlocksPerMultiprocessor that GB10 and RTX 50 devices report say 24, which iosim takes
CC_12_1 = SMLimits("12.1", 24, 1536, 1024, 128, f"{PROGRAMMING_GUIDE}, its 12.x column: 24 blocks, 1,536 threads; "
                   f"100 KB per SM, 99 KB per block; {GRANULARITY}: allocated in 128 B units")


@dataclass(frozen=True)
class GPU:
    """One GPU's numbers that the roofline needs. Peak rates are dense (no 2:4 sparsity)."""

    name: str
    smem_per_sm: Spec  # bytes of shared memory of one SM; one thread block may use 1 KiB less (H100: 227 of 228 KiB)
    hbm_bandwidth: Spec  # bytes per second
    fp16_tensor: Spec  # FLOP/s, tensor cores, float16 inputs with float32 accumulation
    bf16_tensor: Spec | None  # FLOP/s, tensor cores, bfloat16; None where the GPU has none
    fp32: Spec  # FLOP/s, CUDA cores (not TF32 tensor cores)
    sms: Spec  # streaming multiprocessors: how many thread blocks run at once, one per SM (split-kv's default)
    l2: Spec  # bytes of L2 cache, nominal (the datasheet's or whitepaper's figure)
    # bytes of L2 that DRAM traffic sees (iosim.gpu.l2's default capacity), from a published measurement
    l2_effective: Spec
    fp8_tensor: Spec | None = None  # FLOP/s, tensor cores, FP8 (e4m3 or e5m2) inputs; None where the GPU has none
    sm: SMLimits = field(kw_only=True)  # its compute capability's resident limits (iosim.gpu.l2's occupancy bounds)

    def M(self, dtype: str) -> int:
        """The SRAM capacity M of a run in ``dtype``: shared memory per SM, in elements."""
        return int(self.smem_per_sm.value) // DTYPE_ITEMSIZE[dtype]

    def peak(self, dtype: str) -> float:
        """Peak matmul FLOP/s for ``dtype``."""
        specs = {"float16": self.fp16_tensor, "bfloat16": self.bf16_tensor, "float32": self.fp32,
                 **{fp8: self.fp8_tensor for fp8 in FP8_DTYPES}}
        spec = specs.get(dtype)
        if spec is None:
            allowed = [t for t, s in specs.items() if s is not None]
            raise InputError(f"dtype={dtype!r} has no peak FLOP/s in the {self.name} preset; allowed: {allowed}")
        return spec.value


A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB), dense"
H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense"
H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM), dense"
T4_DATASHEET = "NVIDIA T4 Tensor Core GPU datasheet"
B200_DATASHEET = "NVIDIA HGX B200 datasheet (1000 W), dense"
MB = 10**6
MiB = 2**20
# The L2 of A100 and H100 is two partitions; a line that SMs of both halves read is held in both, so the
# capacity DRAM sees is below the nominal one. RRZE-HPC gpu-benches (github.com/RRZE-HPC/gpu-benches, the
# gpu-l2-cache benchmark: L2 bandwidth against data volume) shows the L2 plateau ending near 37 MB on an H100
# PCIe and 28 MB on an A100 80 GB, as quoted in issue 17. FlashAttention-3's scheduler budgets 32 MB of the
# H100's 50 MB for K and V (Shah et al., 2024), a design margin rather than a measurement: iosim takes the
# measurement, and experiments/l2_call1.py reports every row's sensitivity over 0.5-1.0x nominal.
L2_PLATEAU = "RRZE-HPC gpu-benches gpu-l2-cache, end of the L2 bandwidth plateau"
GB10_QUERY = "deviceQuery of a DGX Spark's GB10 (CUDA 13.0), as published in 'Day 3: The DGX Spark Unpacked' " \
             "(blog.kubesimplify.com, 2026)"


def bus_bandwidth(bus_bits: int, transfers_per_s: float) -> float:
    """Peak DRAM bytes per second: the bus width in bytes times the transfers per second of each pin."""
    return bus_bits / 8 * transfers_per_s


GPUS: dict[str, GPU] = {
    "a100": GPU(
        "A100",
        Spec(164 * KiB, "NVIDIA Ampere tuning guide: up to 164 KB shared memory per SM"),
        # the FlashAttention paper's A100 (section 2.1 gives 1.5-2.0 TB/s for 40-80 GB)
        # bus width x data rate gives 1,555.2 GB/s (5,120-bit HBM2 x 2.43 GT/s: deviceQuery of an A100 40GB SXM4,
        # memory clock 1,215 MHz, double data rate); the datasheet's 1,555, the figure the paper's results use, is kept
        Spec(1555e9, f"{A100_DATASHEET}: 1,555 GB/s HBM2"),
        Spec(312e12, f"{A100_DATASHEET}: FP16 Tensor Core 312 TFLOPS"),
        Spec(312e12, f"{A100_DATASHEET}: BF16 Tensor Core 312 TFLOPS"),
        Spec(19.5e12, f"{A100_DATASHEET}: FP32 19.5 TFLOPS"),
        Spec(108, "NVIDIA A100 Tensor Core GPU architecture whitepaper: 108 SMs"),
        Spec(40 * MiB, "NVIDIA A100 Tensor Core GPU architecture whitepaper: 40 MB L2 (cudaDeviceProp.l2CacheSize "
             "40 MiB)"),
        Spec(28 * MB, f"{L2_PLATEAU}: near 28 MB on an A100 80 GB (same 40 MB L2 as the 40 GB SXM4)"),
        sm=CC_8_0,
    ),
    "h100": GPU(
        "H100",
        Spec(228 * KiB, "NVIDIA Hopper tuning guide: up to 228 KB shared memory per SM"),
        Spec(bus_bandwidth(5120, 2 * 2619e6), "5,120-bit HBM3 bus (NVIDIA H100 whitepaper's spec table) x 5.238 "
             "GT/s (deviceQuery of an H100 SXM5: memory clock 2,619 MHz, double data rate) = 3,352 GB/s; the "
             f"{H100_DATASHEET} rounds it to 3.35 TB/s"),
        Spec(989.4e12, f"{H100_DATASHEET}: FP16 Tensor Core 1,979 TFLOPS with sparsity; dense 989.4 = "
             "132 SMs x 1,830 MHz x 4,096 FLOPs per SM per clock, which the datasheet doubles and rounds"),
        Spec(989.4e12, f"{H100_DATASHEET}: BF16 Tensor Core 1,979 TFLOPS with sparsity; dense 989.4 = "
             "132 SMs x 1,830 MHz x 4,096 FLOPs per SM per clock, which the datasheet doubles and rounds"),
        Spec(67e12, f"{H100_DATASHEET}: FP32 67 TFLOPS"),
        Spec(132, "NVIDIA H100 Tensor Core GPU architecture whitepaper: 132 SMs (SXM5)"),
        Spec(50 * MiB, "NVIDIA H100 Tensor Core GPU architecture whitepaper: 50 MB L2 (SXM5; "
             "cudaDeviceProp.l2CacheSize 50 MiB)"),
        Spec(37 * MB, f"{L2_PLATEAU}: near 37 MB on an H100 PCIe, whose L2 is the same 50 MB of the same GH100"),
        Spec(1978.9e12, f"{H100_DATASHEET}: FP8 Tensor Core 3,958 TFLOPS with sparsity; dense 1,978.9 = "
             "132 SMs x 1,830 MHz x 8,192 FLOPs per SM per clock, which the datasheet doubles and rounds"),
        sm=CC_9_0,
    ),
    "h200": GPU(
        "H200",
        Spec(228 * KiB, "NVIDIA Hopper tuning guide: up to 228 KB shared memory per SM (same GH100 SM as H100)"),
        # the bus is 6,144 bits (six 1,024-bit HBM3e stacks, all of GH100's memory controllers), but no published
        # deviceQuery or clock gives its data rate: press reports of the launch give 6.2, 6.4 and 6.5 Gb/s per pin,
        # and the datasheet's 4.8 TB/s implies 6.25; the datasheet's figure is kept until a lent H200 reports it
        Spec(4.8e12, f"{H200_DATASHEET}: 4.8 TB/s HBM3e"),
        Spec(989.4e12, f"{H200_DATASHEET}: FP16 Tensor Core 1,979 TFLOPS with sparsity; dense 989.4 = "
             "132 SMs x 1,830 MHz x 4,096 FLOPs per SM per clock, which the datasheet doubles and rounds"),
        Spec(989.4e12, f"{H200_DATASHEET}: BF16 Tensor Core 1,979 TFLOPS with sparsity; dense 989.4 = "
             "132 SMs x 1,830 MHz x 4,096 FLOPs per SM per clock, which the datasheet doubles and rounds"),
        Spec(67e12, f"{H200_DATASHEET}: FP32 67 TFLOPS"),
        Spec(132, "the H100 SXM5's GH100 configuration, 132 SMs (the H200 changes the memory only)"),
        # NVIDIA publishes no L2 size for the H200. The GH100 die has 60 MB of L2 beside 12 memory controllers (Chips
        # and Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023); the H100 SXM5 enables 10 of them and
        # 50 MB, the H200 all 12 (six HBM3e stacks) and, as devices report it, all 60 MB.
        Spec(60 * MiB, "cudaDeviceProp.l2CacheSize 62,914,560 (60 MiB) as reported by an H200 (sm 9.0, driver "
             "570.124.06) in a published L2-residency probe; not in NVIDIA's datasheet"),
        # the same reading as the H100's and the A100's: the curve's last data set within 10 % of its plateau (the
        # H100 PCIe's 36,864 kB, the A100 80 GB's 28,160 kB), its kB taken as 10^3 B (main.cu divides by 1,024:
        # read as KiB, each would be 2.4 % larger); within 5 % the H200's plateau ends one point earlier, 40,448 kB
        Spec(44 * MB, f"{L2_PLATEAU} on an H200 (gpu-l2-cache/h200.txt): 9,105 GB/s at 44,032 kB against a plateau "
             "of 9,836 (the median over 8-32 MiB), 7,543 at 48,128 kB; the H100's share of its nominal L2 (37 MB "
             "of 50 MiB) applied to 60 MiB gives the same 44 MB"),
        Spec(1978.9e12, f"{H200_DATASHEET}: FP8 Tensor Core 3,958 TFLOPS with sparsity; dense 1,978.9 = "
             "132 SMs x 1,830 MHz x 8,192 FLOPs per SM per clock, which the datasheet doubles and rounds"),
        sm=CC_9_0,
    ),
    "t4": GPU(
        "T4",
        Spec(64 * KiB, "NVIDIA Turing tuning guide: up to 64 KB shared memory per SM"),
        Spec(bus_bandwidth(256, 2 * 5001e6), "256-bit GDDR6 bus x 10.002 GT/s (deviceQuery of a Tesla T4, CUDA "
             f"10.0: memory clock 5,001 MHz, double data rate, bus width 256-bit) = 320.06 GB/s; the {T4_DATASHEET} "
             "gives 320 GB/s"),
        Spec(65e12, f"{T4_DATASHEET}: mixed-precision (FP16/FP32) 65 TFLOPS"),
        None,  # Turing tensor cores have no bfloat16
        Spec(8.1e12, f"{T4_DATASHEET}: single-precision 8.1 TFLOPS"),
        Spec(40, "NVIDIA Turing architecture whitepaper: the T4's TU104 with 40 SMs"),
        Spec(4 * MiB, "NVIDIA Turing architecture whitepaper: TU104, 4096 KB L2"),
        Spec(4 * MiB, "no published measurement of the capacity DRAM sees: the nominal 4096 KB"),
        sm=CC_7_5,
    ),
    "b200": GPU(
        "B200",
        Spec(228 * KiB, "NVIDIA Blackwell tuning guide: up to 228 KB shared memory per SM"),
        # eight 1,024-bit HBM3e stacks (8,192 bits over the two dies); no published data rate: the datasheet's figure,
        # which implies 7.8 GT/s per pin
        Spec(8e12, f"{B200_DATASHEET}: 8 TB/s HBM3e"),
        Spec(2.25e15, f"{B200_DATASHEET}: FP16 Tensor Core 4.5 PFLOPS with sparsity, halved"),
        Spec(2.25e15, f"{B200_DATASHEET}: BF16 Tensor Core 4.5 PFLOPS with sparsity, halved"),
        Spec(80e12, f"{B200_DATASHEET}: FP32 80 TFLOPS"),
        Spec(148, "NVIDIA Blackwell B200: 148 SMs over its two dies"),
        Spec(126 * MiB, "not in NVIDIA's B200 datasheet: 126 MB over its two dies is the figure third-party "
             "device queries report, unverified here"),
        Spec(126 * MiB, "no published measurement of the capacity DRAM sees: the nominal 126 MB"),
        Spec(4.5e15, f"{B200_DATASHEET}: FP8 Tensor Core 9 PFLOPS with sparsity, halved"),
        sm=CC_10_0,
    ),
    "gb10": GPU(
        "GB10",
        Spec(100 * KiB, "CUDA C++ Programming Guide, compute capability 12.x: 100 KB shared memory per SM (99 KB "
             "per block); the GB10 is compute capability 12.1"),
        Spec(bus_bandwidth(256, 8533e6), f"{GB10_QUERY}: 256-bit LPDDR5X bus at 8,533 MT/s = 273 GB/s, the figure "
             "NVIDIA gives for the DGX Spark"),
        Spec(125e12, "derived, not published: NVIDIA's 1 PFLOP of FP4 with sparsity for the GB10, halved for dense "
             "and halved twice more for 8- and then 16-bit inputs, the ratios of NVIDIA's Blackwell datasheets"),
        Spec(125e12, "derived, not published: as the FP16 figure (bfloat16 at the FP16 rate on Blackwell)"),
        Spec(48 * 128 * 2 * 2418e6, f"{GB10_QUERY}: 48 SMs x 128 CUDA cores x 2 FLOPs per FMA x 2,418 MHz "
             "(its maximum clock)"),
        Spec(48, f"{GB10_QUERY}: 48 multiprocessors"),
        Spec(24 * MiB, f"{GB10_QUERY}: L2 cache size 25,165,824 bytes"),
        Spec(24 * MiB, "no published measurement of the capacity DRAM sees: the nominal 24 MiB, the capacity "
             "arXiv 2601.16032 (sawtooth wavefront reordering on GB10) reasons with"),
        Spec(250e12, "derived, not published: NVIDIA's 1 PFLOP of FP4 with sparsity for the GB10, halved for dense "
             "and halved once more for 8-bit inputs, the ratios of NVIDIA's Blackwell datasheets"),
        sm=CC_12_1,
    ),
}


def get_gpu(name: str) -> GPU:
    """The preset of ``name``, in any case: "h100", or "H100" as records name it."""
    if not isinstance(name, str) or name.lower() not in GPUS:
        raise InputError(f"gpu={name!r} is not one of {sorted(GPUS)}")
    return GPUS[name.lower()]


def preset_name(gpu: str | None) -> str | None:
    """What a record's ``gpu`` field holds: the preset's name ("H100" for gpu="h100"), None without a preset."""
    return None if gpu is None else get_gpu(gpu).name


@dataclass(frozen=True)
class Roofline:
    """A run's time on a GPU by the roofline model: a lower bound, see the module docstring."""

    gpu: str
    seconds: float
    bound: str  # "memory" or "compute"
    intensity: float  # matmul FLOPs per HBM byte


def roofline(gpu: GPU, dtype: str, hbm_bytes: int, flops: Flops) -> Roofline:
    """T = max(matmul FLOPs / peak, HBM bytes / bandwidth) for a run in ``dtype``."""
    compute = flops.matmul / gpu.peak(dtype)
    memory = hbm_bytes / gpu.hbm_bandwidth.value
    return Roofline(gpu.name, max(compute, memory), "compute" if compute > memory else "memory",
                    flops.matmul / hbm_bytes if hbm_bytes else float("inf"))


def resolve_M(M, gpu: str | None, dtype: str, default="100k") -> int:
    """The SRAM capacity M of a run, in elements, from ``M`` and a GPU preset.

    Without a preset, ``M`` (or ``default``). With one, M is its shared memory per SM
    unless ``M`` is given too, which then wins if it fits the SM (a kernel may use
    less shared memory than there is); an M above the SM's shared memory is refused.
    """
    if gpu is None:
        return parse_size(default if M is None else M, dtype)
    preset = get_gpu(gpu)
    smem = preset.M(dtype)
    if M is None:
        return smem
    m = parse_size(M, dtype)
    if m > smem:
        raise InputError(f"M={M!r} is {m:,} elements of {dtype}, more than the {preset.name}'s shared memory per SM "
                         f"({smem:,} elements); allowed with gpu={gpu!r}: M <= {smem:,}, or no M to use all of it")
    return m


DEFAULT = "h100"  # the preset of a run that names none: split-kv's default splits fill its SMs
