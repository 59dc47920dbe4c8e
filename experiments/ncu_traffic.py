"""The kernels' DRAM bytes measured by Nsight Compute, against iosim's count for the same tiling.

Three steps, each a subcommand:

    python -m experiments.ncu_traffic profile --grid traffic --out DIR   # on a GPU: runs ncu
    python -m experiments.ncu_traffic compare DIR [--out PREFIX] [--predictions FILE]
                                                                         # anywhere: ratios
    python -m experiments.ncu_traffic launch --grid sanitize             # the program ncu or
                                                                         # compute-sanitizer runs

`profile` runs `launch` under

    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum --cache-control all --csv
        --print-units base --profile-from-start off

and writes DIR/ncu.csv (ncu's raw output) and DIR/configs.json (what was launched, with
the kernel's own tiling). `launch` runs each configuration once inside
cudaProfilerStart/Stop, after a forward pass for a backward configuration, and opens each
with a one-thread marker kernel whose grid size is the configuration's index + 1, so every
row of ncu's CSV is attributed to its configuration without guessing kernel names.

`compare` needs no GPU: it reads a profiled folder, sums each configuration's kernels and
sets them beside ``iosim.count(impl, ..., dtype, tiling=iosim.Tiling(Br, Bc), M=M)`` with the
B_r, B_c recorded in configs.json (the tiling the kernels chose when they were measured), the
configuration's dtype, and M the SRAM those tiles need (the simulator's peak at that
tiling). It writes PREFIX.json and PREFIX.md (PREFIX defaults to DIR/traffic): measured /
simulated for reads and writes, and measured / compulsory, where compulsory is each
simulated tensor moved once (Q, K, V read, O, ℓ, m written): the traffic left when a cache
holds everything. iosim counts the forward pass only, so backward rows carry the
measurement alone.

`--predictions FILE` joins the L2 model's DRAM bytes (experiments.predict_next_call's
predictions-<commit>.json, committed before the run it predicts; for call 1,
experiments.l2_call1's l2_call1.json, made after that run but not fitted to it) to every row they
share impl, direction, dtype, batch, heads, N_q, N_k, d, causal and dropout with: keys `dram_read_pred_bytes` and
`dram_write_pred_bytes` (DRAM writes during the kernels, what ncu counts), the ratios
measured / predicted `dram_read_ratio` and `dram_write_ratio`, and the file and commit
they came from. A row without a prediction is listed, not dropped.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import iosim
from iosim import kernels
from iosim.core.problem import AttentionShape
from iosim.gpu.grids import sdpa_flash
from iosim.kernels import bfloat16 as bf16
from iosim.kernels import flash_swapped_tc, split_kv
from iosim.kernels.api import BACKWARD_IMPLS

REPO = Path(__file__).resolve().parents[1]
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
DIRECTIONS = ("forward", "backward")
MARKER = "ncu_config_marker"
# torch's scaled_dot_product_attention on its flash backend (FlashAttention-2's kernels), named as the DRAM level's
# description of it (iosim.gpu.kernels); its rows need torch, which the device machine has
SDPA = "sdpa-flash"


@dataclass(frozen=True)
class LaunchConfig:
    impl: str
    direction: str  # "forward" or "backward"
    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    dtype: str  # "float32", "float16" or "bfloat16" (flash-swapped-tc)
    causal: bool = False
    dropout_p: float = 0.0
    kv_heads: int | None = None  # K/V heads under grouped-query attention (flash-swapped's forward); None: heads
    splits: int | None = None  # split-kv's K/V splits, fixed here so that the launch does not depend on the SMs
    sawtooth: bool = False  # flash-swapped's forward with odd query blocks scanning K/V backward

    @classmethod
    def from_record(cls, record: dict) -> LaunchConfig:
        """A configuration as configs.json records it: its fields, beside the tiling it ran (``tile``), left out."""
        return cls(**{k: v for k, v in record.items() if k != "tiling"})

    @property
    def kv(self) -> int:
        """K/V heads: kv_heads, or heads without grouped-query attention."""
        return self.heads if self.kv_heads is None else self.kv_heads

    def tiling(self):
        """The tiling the host API launches with for this d and direction."""
        return kernels.resolve_config(self.impl, self.d, self.direction == "backward")

    def tile(self) -> dict:
        """The B_r × B_c the kernel runs: the host API's tiling, except flash-swapped-tc's 16-bit kernels, which
        ignore it: the forward runs B_r = 64 rows (4 warps × m16) by keys_per_step(d) keys, the backward
        B_c = 64 keys (BKB) by queries_per_step(d) queries a step."""
        if self.impl == SDPA:  # its own, the split-KV kernel's where torch splits on the H100's SMs
            tiles = sdpa_flash.BACKWARD_TILE if self.direction == "backward" else sdpa_flash.FORWARD_TILE
            shape = AttentionShape(self.batch, self.heads, self.n_q, self.n_k, self.d, kv_heads=self.kv_heads)
            if self.direction == "forward" and sdpa_flash.forward_splits(shape, H100_SMS) > 1:
                tiles = sdpa_flash.SPLIT_TILE
            return dict(zip(("Br", "Bc"), tiles[self.d]))
        if self.impl == "flash-swapped-tc" and self.dtype != "float32":
            if self.direction == "forward":
                return {"Br": flash_swapped_tc.BR, "Bc": flash_swapped_tc.keys_per_step(self.d)}
            return {"Br": flash_swapped_tc.queries_per_step(self.d), "Bc": flash_swapped_tc.BKB}
        return asdict(self.tiling())


def fused_impls() -> list[str]:
    """Kernel impls that are also simulated algorithms and tile with a TileConfig (B_r × B_c)."""
    return [
        name for name, module in kernels.IMPLS.items()
        if name in iosim.ALGORITHMS and isinstance(module.FORWARD_TILES[0], kernels.TileConfig)
    ]


def traffic_grid() -> list[LaunchConfig]:
    """One batch·head and 256 (batch 16, heads 16), float32, full attention."""
    configs = []
    for impl in fused_impls():
        for d in (64, 128):
            for batch, heads, sizes in ((1, 1, (1024, 4096, 16384)), (16, 16, (1024, 4096))):
                for n in sizes:
                    configs.append(LaunchConfig(impl, "forward", batch, heads, n, n, d, "float32"))
                    if n <= 4096:  # the backward of one block per batch·head is slow past that
                        configs.append(LaunchConfig(impl, "backward", batch, heads, n, n, d, "float32"))
    return configs


def sanitize_grid() -> list[LaunchConfig]:
    """Every impl and direction at small ragged shapes: causal with dropout and N_q ≠ N_k both ways, float16; split-kv
    decoding with its query heads packed by group, over several splits; flash-swapped-tc in bfloat16 and
    flash-swapped's sawtooth order."""
    configs = []
    for impl in kernels.IMPLS:
        for direction in DIRECTIONS if impl in BACKWARD_IMPLS else ("forward",):
            configs.append(LaunchConfig(impl, direction, 1, 2, 100, 77, 64, "float32", causal=True, dropout_p=0.2))
            configs.append(LaunchConfig(impl, direction, 1, 1, 77, 100, 128, "float16", causal=True))
    configs.append(LaunchConfig("split-kv", "forward", 2, 8, 1, 1000, 128, "float16", kv_heads=2, splits=7))
    for direction in DIRECTIONS:  # the tensor-core kernel's bfloat16 build
        configs.append(LaunchConfig("flash-swapped-tc", direction, 1, 1, 77, 100, 64, "bfloat16", causal=True))
    configs.append(LaunchConfig("flash-swapped", "forward", 1, 2, 100, 77, 64, "float16", sawtooth=True))
    return configs


# Call 3 (issue 17, item 4): the configurations experiments/predict_next_call.py predicts, forward then backward.
CALL3_KERNELS = (("flash-swapped", "float32"), ("flash-swapped", "float16"),
                 ("flash-swapped-tc", "float16"), ("flash-swapped-tc", "bfloat16"))
CALL3_BH = (1, 16, 256, 1024)  # as batch × heads: 1×1, 1×16, 16×16, 64×16
CALL3_N = (1024, 4096, 16384, 65536)  # 65536: K and V of one head (≥ 16.8 MB) pass half the effective L2
# Elements of one (batch·heads, N, d) tensor at most: 2²⁷ (512 MiB in float32), so that the host's random
# inputs take seconds and Q, K, V, O fit the device; this drops batch·heads 256 at N ≥ 16384 and 1024 at
# N ≥ 4096 (about 10¹⁶ FLOPs of CUDA-core forward each, minutes under ncu).
CALL3_MAX_ELEMENTS = 2**27
# The backward: flash-swapped's CUDA-core kernels only (row_dot, fill, the main kernel, and cast in float16),
# the pass iosim.gpu.kernels' flash-swapped launches (Kernel.grids), at the square B × B tile the host API
# picks (LaunchConfig.tile(): 32×32 at d = 64, 16×16 at d = 128). N = 16384 only at batch·heads 1 and 16: its
# simulation takes at most about 7 s per L2 capacity there (d = 128), and 256 × 16384 would be 16 times that.
# flash-swapped-tc's 16-bit backward (float16, bfloat16) is its own part, call3-tc-backward, at the same shapes:
# its tile is 64 keys by queries_per_step(d) queries (64 × 64 at d = 64, 64 × 16 at d = 128), its blocks visit
# the query blocks every key sees whole before the masked ones (predict_next_call.tc_backward_grid).
CALL3_BACKWARD_KERNELS = (("flash-swapped", "float32"), ("flash-swapped", "float16"))
CALL3_TC_BACKWARD_KERNELS = (("flash-swapped-tc", "float16"), ("flash-swapped-tc", "bfloat16"))
CALL3_BACKWARD_BH = (1, 16, 256)
CALL3_BACKWARD_N = (1024, 4096, 16384)
CALL3_BACKWARD_LONG = (16384, 16)  # N from which batch·heads is at most 16


def call3_forward_grid() -> list[LaunchConfig]:
    """Forward of flash-swapped (float32, float16) and flash-swapped-tc (float16, bfloat16), full and causal."""
    configs = []
    for impl, dtype in CALL3_KERNELS:
        for d in (64, 128):
            for causal in (False, True):
                for bh in CALL3_BH:
                    for n in CALL3_N:
                        if bh * n * d <= CALL3_MAX_ELEMENTS:
                            batch, heads = max(1, bh // 16), min(bh, 16)
                            configs.append(LaunchConfig(impl, "forward", batch, heads, n, n, d, dtype, causal=causal))
    return configs


def call3_backward_grid(kernel_dtypes=CALL3_BACKWARD_KERNELS) -> list[LaunchConfig]:
    """Backward of flash-swapped (float32, float16), or of the kernels given, full and causal, batch·heads 1, 16,
    256, N 1024 to 16384."""
    configs = []
    long_n, long_bh = CALL3_BACKWARD_LONG
    for impl, dtype in kernel_dtypes:
        for d in (64, 128):
            for causal in (False, True):
                for bh in CALL3_BACKWARD_BH:
                    for n in CALL3_BACKWARD_N:
                        if n < long_n or bh <= long_bh:
                            batch, heads = max(1, bh // 16), min(bh, 16)
                            configs.append(LaunchConfig(impl, "backward", batch, heads, n, n, d, dtype, causal=causal))
    return configs


def call3_tc_backward_grid() -> list[LaunchConfig]:
    return call3_backward_grid(CALL3_TC_BACKWARD_KERNELS)


# Grouped-query attention with per-head blocks: flash-swapped's forward, float16, 32 query heads over 8 K/V
# heads (Llama-3-8B) and over 1 (multi-query), batch 1, N 4096 to 65536, d 64 and 128, full and causal, within
# CALL3_MAX_ELEMENTS. The blocks of a group's 4 (or 32) heads read one K_j, V_j: what the L2 makes of that.
CALL3_GQA_HEADS = ((32, 8), (32, 1))
CALL3_GQA_N = (4096, 16384, 65536)


def call3_gqa_grid() -> list[LaunchConfig]:
    configs = []
    for d in (64, 128):
        for causal in (False, True):
            for heads, kv_heads in CALL3_GQA_HEADS:
                for n in CALL3_GQA_N:
                    if heads * n * d <= CALL3_MAX_ELEMENTS:
                        configs.append(LaunchConfig("flash-swapped", "forward", 1, heads, n, n, d, "float16",
                                                    causal=causal, kv_heads=kv_heads))
    return configs


# split-kv decoding (one query per head), float16: its split kernel and its combine, at the splits iosim's
# default_splits gives an H100's 132 SMs at the kernel's tile (at most its K/V blocks), batch 1 to 64, 32 query
# heads over 8 K/V heads (Llama-3-8B), 32 (multi-head) and 1 (multi-query), N_k 4096 to 131072, d 64 and 128,
# K within CALL3_MAX_ELEMENTS. K and V are read once whatever the L2; what it decides is whether Q, read by every
# split, and the float32 partials the split kernel writes are DRAM traffic or stay in the L2.
CALL3_SPLITKV_HEADS = ((32, 8), (32, 32), (32, 1))
CALL3_SPLITKV_BATCH = (1, 8, 64)
CALL3_SPLITKV_N = (4096, 16384, 65536, 131072)
# iosim.core.gpus' h100 preset (SXM5), which the predictions take; fixed, so a PCIe card launches the same
H100_SMS = 132


def call3_split_kv_grid() -> list[LaunchConfig]:
    configs = []
    for d in (64, 128):
        for heads, kv_heads in CALL3_SPLITKV_HEADS:
            for batch in CALL3_SPLITKV_BATCH:
                for n in CALL3_SPLITKV_N:
                    if batch * kv_heads * n * d <= CALL3_MAX_ELEMENTS:
                        shape = AttentionShape(batch, heads, 1, n, d, kv_heads=kv_heads)
                        config = kernels.resolve_config("split-kv", d, False)
                        splits = split_kv.resolve_splits(None, shape, False, config, sms=H100_SMS)
                        configs.append(LaunchConfig("split-kv", "forward", batch, heads, 1, n, d, "float16",
                                                    kv_heads=kv_heads, splits=splits))
    return configs


# The sawtooth order against the plain one (issue 17, item 5): flash-swapped's forward, float16, full attention, one
# and four heads, N 32,768 to 131,072 (K and V of a head 8.4 to 67 MB at d = 128: under, near and over the L2), d 64
# and 128, each shape in both orders. The lockstep and the staggered schedule disagree on whether it pays.
CALL3_SAWTOOTH_BH = (1, 4)
CALL3_SAWTOOTH_N = (32768, 65536, 131072)


def call3_sawtooth_grid() -> list[LaunchConfig]:
    return [LaunchConfig("flash-swapped", "forward", 1, bh, n, n, d, "float16", sawtooth=sawtooth)
            for d in (64, 128) for bh in CALL3_SAWTOOTH_BH for n in CALL3_SAWTOOTH_N for sawtooth in (False, True)]


def call3_grid() -> list[LaunchConfig]:
    """Call 3: the forward rows first (their indices as predictions-2502058 numbered them), then flash-swapped's
    backward (as predictions-80f2354 numbered them), then flash-swapped-tc's, then grouped-query forwards, then
    split-kv decoding, then the sawtooth order beside the plain one."""
    return (call3_forward_grid() + call3_backward_grid() + call3_tc_backward_grid() + call3_gqa_grid()
            + call3_split_kv_grid() + call3_sawtooth_grid())


def _short(impl: str, direction: str, dtype: str, bh: int, n: int, d: int, **options) -> LaunchConfig:
    """A call-3 row as the call-3 grids lay it out: batch·heads bh as batch 1, heads bh up to 16, else batch bh/16
    by 16 heads; the sawtooth grid's rows as batch 1, heads bh."""
    batch, heads = (1, bh) if options.get("sawtooth") is not None else (max(1, bh // 16), min(bh, 16))
    return LaunchConfig(impl, direction, batch, heads, n, n, d, dtype, **options)


FS, TC = "flash-swapped", "flash-swapped-tc"


def call3_short_schedule_grid() -> list[LaunchConfig]:
    """Call 3's short grid, part 1 (issue 28, item 4): rows of the committed call-3 predictions on which the lockstep
    and the staggered schedule part by 3× to 460×, in few waves (one head) and many (16 heads), with one head's K and
    V under and over the L2, both K/V orders where the sawtooth rows part; then a row each of the tensor-core kernel
    and of the causal mask. experiments/call3_short.py prints each row's two predictions."""
    f = "forward"
    return [
        _short(FS, f, "float16", 1, 131072, 128, sawtooth=False),
        _short(FS, f, "float16", 1, 131072, 128, sawtooth=True),
        _short(FS, f, "float32", 1, 65536, 128), _short(FS, f, "float32", 16, 65536, 128),
        _short(FS, f, "float16", 4, 131072, 64, sawtooth=False),
        _short(FS, f, "float16", 4, 131072, 64, sawtooth=True),
        _short(FS, f, "float16", 1, 131072, 64, sawtooth=False),
        _short(FS, f, "float16", 4, 65536, 128, sawtooth=False), _short(FS, f, "float16", 4, 65536, 128, sawtooth=True),
        _short(TC, f, "float16", 16, 65536, 128), _short(FS, f, "float32", 16, 65536, 64),
        _short(FS, f, "float32", 1, 65536, 128, causal=True),
    ]


def call3_short_rest_grid() -> list[LaunchConfig]:
    """Call 3's short grid, part 2: the backward rows where the schedules part most (1.4× to 1.8×), the longest
    sawtooth rows, a 16-head causal row the model has K/V re-read about 50 times, and controls: a row with every
    block resident at once (batch·heads 256), a tiny launch, the bfloat16 twin of a float16 row (equal bytes),
    grouped-query heads, and split-kv decoding's two kernels, which have never run on hardware."""
    f, b = "forward", "backward"
    return [
        _short(FS, b, "float32", 16, 16384, 128), _short(FS, b, "float32", 1, 16384, 128),
        _short(TC, b, "float16", 16, 16384, 128), _short(FS, b, "float32", 16, 16384, 64),
        _short(FS, f, "float16", 4, 131072, 128, sawtooth=False),
        _short(FS, f, "float16", 4, 131072, 128, sawtooth=True),
        _short(FS, f, "float32", 16, 65536, 128, causal=True),
        _short(FS, f, "float32", 256, 4096, 128), _short(FS, f, "float32", 1, 1024, 64),
        _short(TC, f, "bfloat16", 16, 65536, 128), _short(FS, f, "float32", 16, 16384, 128),
        LaunchConfig(FS, f, 1, 32, 65536, 65536, 64, "float16", kv_heads=8),
        *[c for c in call3_split_kv_grid() if (c.batch, c.heads, c.kv_heads, c.n_k, c.d) in SHORT_SPLIT_KV],
    ]


# split-kv rows of the short grid: Llama-3-8B's heads at one batch and at 8, the longest K/V
SHORT_SPLIT_KV = ((1, 32, 8, 131072, 128), (8, 32, 8, 16384, 128))


# torch SDPA's flash backend (issue 28, item 4; kernel="sdpa-flash"): float16 (and one bfloat16 twin, equal bytes),
# full and causal, d 64 and 128, batch·heads 1 to 256, N 1024 to 131072, forward and backward. The forward rows are
# shapes torch runs unsplit (batch·heads·⌈N/64⌉ ≥ 0.8 × 2 × 132). One head's K and V are 16.8 MB (d = 64) and 33.5
# MB (d = 128) at N = 65536 and 67 MB at 131072 (d = 128): under, near and over the effective 37 MB of L2.
def call3_sdpa_grid() -> list[LaunchConfig]:
    f, b = "forward", "backward"
    rows = [_short(SDPA, f, "float16", bh, n, d, causal=causal) for d in (64, 128) for causal in (False, True)
            for bh, n in ((1, 65536), (16, 16384), (256, 4096))]
    rows += [_short(SDPA, f, "float16", 1, 131072, 128, causal=causal) for causal in (False, True)]
    rows += [_short(SDPA, f, "bfloat16", 16, 16384, 128), _short(SDPA, f, "float16", 16, 1024, 64)]
    rows += [_short(SDPA, b, "float16", bh, n, d) for d in (64, 128) for bh, n in ((16, 16384), (256, 4096))]
    rows += [_short(SDPA, b, "float16", 16, 16384, 128, causal=True), _short(SDPA, b, "float16", 1, 65536, 128)]
    return rows


def call5_split_grid() -> list[LaunchConfig]:
    """SDPA's split-KV forward (FlashAttention-2's flash_fwd_splitkv_kernel and its combine), where torch splits K/V
    on an H100 (batch·heads·⌈N_q/64⌉ < 211): decoding one token at 32 heads against 8,192 and 65,536 keys, at 8 heads
    of d = 64, and prefills of one head (N = 4,096, d = 128) and of 4 causal heads (N = 1,024, d = 64)."""
    f = "forward"
    return [LaunchConfig(SDPA, f, 1, 32, 1, 8192, 128, "float16"),
            LaunchConfig(SDPA, f, 1, 32, 1, 65536, 128, "float16"),
            LaunchConfig(SDPA, f, 1, 8, 1, 32768, 64, "bfloat16"), _short(SDPA, f, "float16", 1, 4096, 128),
            LaunchConfig(SDPA, f, 1, 4, 1024, 1024, 64, "float16", causal=True)]


def call5_sdpa_grid() -> list[LaunchConfig]:
    """SDPA's causal forward at d = 128, which call 4 measured reading 1.4× to 2.5× its prediction where causal at
    d = 64 and the unmasked rows held: N at one head and at 16, more heads, bfloat16, an unmasked twin, and causal at
    d = 64 with one head's K and V as large as at d = 128, N = 65,536 (which it repeats)."""
    f = "forward"
    rows = [_short(SDPA, f, "float16", 1, n, 128, causal=True) for n in (16384, 32768, 65536)]
    rows += [_short(SDPA, f, "float16", bh, n, 128, causal=True) for bh, n in ((16, 4096), (16, 8192), (64, 4096))]
    rows += [_short(SDPA, f, "bfloat16", 16, 16384, 128, causal=True), _short(SDPA, f, "float16", 1, 32768, 128),
             _short(SDPA, f, "float16", 1, 131072, 64, causal=True)]
    return rows


def call5_code_grid() -> list[LaunchConfig]:
    """What iosim's kernels read beyond their tensors (issue 28, item 1): launches small enough (N = 256) that a
    kernel's code and constant banks (20 to 150 KB: experiments/code_bytes.py) are 18 to 32 % of what it reads, in
    thirteen builds without a mask: flash-swapped's forward in float32 at d 64 and 128 and in float16, the tensor-core
    forward in float16 and bfloat16, both backwards (row_dot, fill, the main kernel and, in float16, the cast), and
    split-kv's split and combine; then flash-swapped's forward at one head at N = 1,024, as in call 1, and at
    N = 16,384, where call 1's kernels read 4 to 5 times their code over their inputs."""
    f, b = "forward", "backward"
    return [_short(FS, f, "float32", 1, 256, 64), _short(FS, f, "float32", 1, 256, 128),
            _short(FS, f, "float16", 1, 256, 128), _short(TC, f, "float16", 1, 256, 64),
            _short(TC, f, "bfloat16", 1, 256, 128), _short(FS, b, "float32", 1, 256, 64),
            _short(TC, b, "float16", 1, 256, 128),
            LaunchConfig("split-kv", f, 1, 32, 1, 1024, 128, "float16", kv_heads=8, splits=4),
            _short(FS, f, "float32", 1, 1024, 64), _short(FS, f, "float32", 1, 16384, 64),
            _short(FS, f, "float32", 1, 16384, 128)]


def call5_occupancy_grid() -> list[LaunchConfig]:
    """How many 2-warp blocks an H100 SM holds (experiments/register_occupancy.py): flash's backward at d = 64 in
    float32, 64 threads of 196 registers (the sm_90 report), 4 blocks an SM by registers allocated per sub-partition and
    5 over the whole file, over 8,192 blocks (512 × 16 heads, N = 256): 12 to 16 waves, so that the achieved occupancy
    ncu measures over the kernel tells the two apart."""
    return [LaunchConfig("flash", "backward", 512, 16, 256, 256, 64, "float32")]


GRIDS = {"traffic": traffic_grid, "sanitize": sanitize_grid, "call3": call3_grid,
         "call3-swapped": lambda: [c for c in call3_forward_grid() if c.impl == "flash-swapped"],
         "call3-tc": lambda: [c for c in call3_forward_grid() if c.impl == "flash-swapped-tc"],
         "call3-backward": call3_backward_grid, "call3-tc-backward": call3_tc_backward_grid,
         "call3-gqa": call3_gqa_grid, "call3-split-kv": call3_split_kv_grid, "call3-sawtooth": call3_sawtooth_grid,
         "short-schedule": call3_short_schedule_grid, "short-rest": call3_short_rest_grid,
         "call3-sdpa": call3_sdpa_grid, "call5-sdpa": call5_sdpa_grid, "call5-split": call5_split_grid,
         "call5-code": call5_code_grid, "call5-occupancy": call5_occupancy_grid}


def _inputs(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the dtype the host API takes: bfloat16 as uint16 bit patterns (kernels.bfloat16)."""
    return bf16.to_bfloat16(x) if dtype == "bfloat16" else x.astype(dtype)


def launch(configs: list[LaunchConfig], only: list[int] | None = None) -> None:
    """Run each configuration (of ``only``, indices into ``configs``, where given) once between cudaProfilerStart and
    cudaProfilerStop, after its marker."""
    from numba import cuda

    @cuda.jit
    def ncu_config_marker():
        pass

    rng = np.random.default_rng(0)
    for index, cfg in enumerate(configs):
        if only is not None and index not in only:
            continue
        if cfg.impl == SDPA:
            _launch_sdpa(cfg, index, ncu_config_marker)
            continue
        rows, keys = (cfg.batch, cfg.heads, cfg.n_q, cfg.d), (cfg.batch, cfg.kv, cfg.n_k, cfg.d)
        q, k, v, dout = (cuda.to_device(_inputs(rng.standard_normal(s, dtype=np.float32), cfg.dtype))
                         for s in (rows, keys, keys, rows))
        opts = dict(impl=cfg.impl, causal=cfg.causal, dropout_p=cfg.dropout_p, seed=index)
        if cfg.splits is not None:
            opts["splits"] = cfg.splits
        if cfg.sawtooth:
            opts["sawtooth"] = True
        if cfg.dtype == "bfloat16":
            opts["dtype"] = "bfloat16"  # the inputs are bit patterns (uint16): the results come back as them
        saved = kernels.attention(q, k, v, **opts) if cfg.direction == "backward" else None
        _profiled(cfg, index, ncu_config_marker, cuda.synchronize, lambda: kernels.attention(q, k, v, **opts)
                  if saved is None else kernels.attention_backward(q, k, v, saved.out, saved.lse, dout, **opts))


def _profiled(cfg: LaunchConfig, index: int, marker, synchronize, run) -> None:
    """``run`` a configuration's pass between cudaProfilerStart and cudaProfilerStop, after the marker kernel whose grid
    (index + 1 blocks) attributes ncu's rows to it; ``synchronize`` waits for the stream the pass runs on."""
    from numba import cuda

    synchronize()
    cuda.profile_start()
    marker[index + 1, 1]()
    cuda.synchronize()  # the marker before the pass, whatever stream the pass runs on
    run()
    synchronize()
    cuda.profile_stop()
    print(f"launched {index}: {cfg}", flush=True)


def _launch_sdpa(cfg: LaunchConfig, index: int, marker) -> None:
    """One SDPA row between cudaProfilerStart and cudaProfilerStop, pinned to the flash backend: the forward, or the
    backward of a forward run before it (torch computes the gradients of q, k, v from dout)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(index)
    dtype = getattr(torch, cfg.dtype)

    def tensor(heads: int, n: int):
        """(batch, heads, n, d) as a view of (batch, n, heads, d) memory, the layout FlashAttention-2 runs on: torch's
        flash backward makes dO and O contiguous in that layout, and would copy them (two kernels the description does
        not hold) if they were laid out as (batch, heads, n, d)."""
        return torch.randn((cfg.batch, n, heads, cfg.d), device="cuda", dtype=dtype, generator=gen).transpose(1, 2)

    q, k, v = (tensor(h, n).requires_grad_() for h, n in ((cfg.heads, cfg.n_q), (cfg.kv, cfg.n_k), (cfg.kv, cfg.n_k)))
    dout = tensor(cfg.heads, cfg.n_q)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        def forward():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                                                    enable_gqa=cfg.kv != cfg.heads)

        out = forward() if cfg.direction == "backward" else None
        _profiled(cfg, index, marker, torch.cuda.synchronize,
                  forward if out is None else lambda: torch.autograd.grad(out, (q, k, v), dout))


def ncu_command(ncu: str, grid: str, log_file: Path, only: list[int] | None = None) -> list[str]:
    return [
        ncu, "--metrics", ",".join(METRICS), "--cache-control", "all", "--csv", "--print-units", "base",
        "--profile-from-start", "off", "--log-file", str(log_file),
        sys.executable, "-m", "experiments.ncu_traffic", "launch", "--grid", grid,  # run from REPO (profile)
        *(["--only", *map(str, only)] if only is not None else []),
    ]


def kernel_groups(configs: list[LaunchConfig]) -> list[list[int]]:
    """The configurations' indices by the kernel build they compile (impl, direction, dtype, d, causal with dropout,
    sawtooth; SDPA's rows by direction, its kernels come built), in the order each build first appears: one process
    (one compile) per group."""
    groups: dict[tuple, list[int]] = {}
    for index, c in enumerate(configs):
        groups.setdefault(build(c), []).append(index)
    return list(groups.values())


def build(c: LaunchConfig) -> tuple:
    """What one process compiles (or, for SDPA, imports) to launch a configuration: the kernel build (impl,
    direction, dtype, d, causal with dropout, sawtooth), or for SDPA, whose kernels come built, the direction."""
    if c.impl == SDPA:
        return c.impl, c.direction
    return c.impl, c.direction, c.dtype, c.d, c.causal or c.dropout_p > 0, c.sawtooth


def profile(grid: str, out: Path, ncu: str, grouped: bool = False) -> Path:
    """Profile a grid's configurations under ncu into ``out``: one ncu.csv, or with ``grouped`` one process and one
    ncu-NN.csv per kernel build (``kernel_groups``), so that a run cut short keeps every group that finished (ncu
    writes its CSV when its process ends). Each group's exit status is in groups.json."""
    out.mkdir(parents=True, exist_ok=True)
    configs = GRIDS[grid]()
    (out / "configs.json").write_text(json.dumps(
        [{**asdict(c), "tiling": c.tile()} for c in configs], indent=2) + "\n")
    if not grouped:
        command = ncu_command(ncu, grid, out / "ncu.csv")
        (out / "command.txt").write_text(" ".join(command) + "\n")
        subprocess.run(command, check=True, cwd=REPO)
        return out / "ncu.csv"
    commands, statuses = [], []
    for n, only in enumerate(kernel_groups(configs)):
        command = ncu_command(ncu, grid, out / f"ncu-{n:02d}.csv", only)
        commands.append(" ".join(command))
        (out / "command.txt").write_text("\n".join(commands) + "\n")
        statuses.append({"group": n, "rows": only, "rc": subprocess.run(command, cwd=REPO).returncode})
        (out / "groups.json").write_text(json.dumps(statuses, indent=2) + "\n")
    return out


def ncu_files(folder: Path) -> list[Path]:
    """The CSV files of a folder `profile` wrote: its ncu.csv, or its ncu-NN.csv files."""
    single = folder / "ncu.csv"
    return [single] if single.exists() else sorted(folder.glob("ncu-*.csv"))


def measured_rows(folder: Path) -> list[dict]:
    """Every profiled configuration of a folder `profile` wrote."""
    return [row for path in ncu_files(folder) for row in parse_ncu_csv(path)]


def marker_reads(folder: Path) -> list[float]:
    """The DRAM bytes each marker kernel of a folder `profile` wrote read: one thread, no tensors."""
    return [_number(row["Metric Value"]) for path in ncu_files(folder) for row in csv_rows(path)
            if MARKER in row["Kernel Name"] and row["Metric Name"] == METRICS[0]]


def csv_rows(path: Path) -> csv.DictReader:
    """ncu's CSV rows (its other lines, the profiler's own, left out)."""
    return csv.DictReader([line for line in path.read_text().splitlines() if line.startswith('"')])


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_ncu_csv(path: Path) -> list[dict]:
    """Per configuration index: its kernels and their summed DRAM bytes read and written."""
    kernels_by_id: dict[str, dict] = {}
    for row in csv_rows(path):
        entry = kernels_by_id.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row["Grid Size"],
                                                     "metrics": {}})
        unit = row["Metric Unit"]
        if unit != "byte":
            raise ValueError(f"{path}: metric {row['Metric Name']} has unit {unit!r}; "
                             f"expected 'byte' (--print-units base)")
        entry["metrics"][row["Metric Name"]] = _number(row["Metric Value"])
    configs: list[dict] = []
    current = None
    for kernel_id in sorted(kernels_by_id, key=int):
        entry = kernels_by_id[kernel_id]
        if MARKER in entry["name"]:
            index = int(entry["grid"].strip("()").split(",")[0]) - 1
            current = {"index": index, "kernels": [], "read_bytes": 0.0, "write_bytes": 0.0}
            configs.append(current)
            continue
        if current is None:
            raise ValueError(f"{path}: kernel {entry['name']!r} (ID {kernel_id}) was profiled before any marker")
        current["kernels"].append(entry["name"].split("(")[0][:120])
        current.setdefault("per_kernel", []).append(
            {"read_bytes": entry["metrics"][METRICS[0]], "write_bytes": entry["metrics"][METRICS[1]]})
        current["read_bytes"] += entry["metrics"][METRICS[0]]
        current["write_bytes"] += entry["metrics"][METRICS[1]]
    return configs


# An SRAM no tiling fills: the first count only asks for the peak of the kernel's tiles.
UNBOUNDED_M = 2**50


def simulated(cfg: LaunchConfig, Br: int, Bc: int) -> dict:
    """iosim's forward count of the kernel's algorithm at tiles B_r × B_c and cfg's dtype, with M the SRAM those tiles
    need."""
    options = dict(
        N=cfg.n_q, N_k=cfg.n_k, d=cfg.d, batch=cfg.batch, heads=cfg.heads, kv_heads=cfg.kv_heads, causal=cfg.causal,
        dropout_p=cfg.dropout_p, dtype=cfg.dtype, tiling=iosim.Tiling(Br=Br, Bc=Bc),
        **({} if cfg.splits is None else {"splits": cfg.splits}),
    )
    algorithm = kernels.IMPLS[cfg.impl].ALGORITHM.name  # flash-swapped-tc computes flash-swapped's algorithm
    M = iosim.count(algorithm, M=UNBOUNDED_M, **options).traffic.peak_sram
    result = iosim.count(algorithm, M=M, **options)
    traffic = result.traffic
    data, stat = traffic.tensor("Q").itemsize, traffic.tensor("l").itemsize
    return {
        "Br": result.tiling.Br, "Bc": result.tiling.Bc, "M": result.M,
        "read_bytes": traffic.read_bytes,
        "write_bytes": traffic.write_bytes,
        "compulsory": {
            "read_bytes": cfg.batch * (cfg.heads * cfg.n_q + 2 * cfg.kv * cfg.n_k) * cfg.d * data,
            "write_bytes": cfg.batch * cfg.heads * cfg.n_q * (cfg.d * data + 2 * stat),
        },
        "by_tensor": {x.name: {"read_bytes": x.read_bytes, "write_bytes": x.write_bytes} for x in traffic.tensors},
    }


JOIN = ("impl", "direction", "dtype", "batch", "heads", "n_q", "n_k", "d", "causal", "dropout_p", "kv_heads", "splits",
        "sawtooth")
JOIN_DEFAULTS = {"sawtooth": False}  # fields added later, whose absence means this (kv_heads, splits: None)


def join_key(row: dict) -> tuple:
    """A configuration as measurements and predictions are joined on it: the JOIN fields, where a file or row from
    before a field has none (or null), its default."""
    return tuple(JOIN_DEFAULTS.get(k) if row.get(k) is None else row[k] for k in JOIN)


def join_predictions(rows: list[dict], path: Path) -> None:
    """Put the L2 model's predicted DRAM bytes (a file written before the measurement) beside each row."""
    document = json.loads(path.read_text())
    predicted = {join_key(r): r["predicted"]["effective"] for r in document["rows"]}
    for row in rows:
        pred = predicted.get(join_key(row))
        if pred is None:
            continue
        m = row["measured"]
        row.update(dram_read_pred_bytes=pred["reads"], dram_write_pred_bytes=pred["writes"],
                   dram_read_ratio=m["read_bytes"] / pred["reads"],
                   dram_write_ratio=m["write_bytes"] / pred["writes"] if pred["writes"] else None,
                   predictions=dict(file=str(path), commit=document.get("commit")))


def compare(folder: Path, prefix: Path | None = None, predictions: Path | None = None) -> list[dict]:
    """Measured against simulated bytes per profiled configuration; writes PREFIX.json and PREFIX.md."""
    configs = json.loads((folder / "configs.json").read_text())
    rows = []
    for measured in measured_rows(folder):
        recorded = configs[measured["index"]]
        cfg = LaunchConfig.from_record(recorded)
        row = {**asdict(cfg), "tiling": recorded["tiling"], "measured": measured}
        if cfg.direction == "forward":
            sim = simulated(cfg, recorded["tiling"]["Br"], recorded["tiling"]["Bc"])
            row["simulated"] = sim
            for way in ("read", "write"):
                row[f"{way}_ratio"] = measured[f"{way}_bytes"] / sim[f"{way}_bytes"]
                row[f"{way}_over_compulsory"] = measured[f"{way}_bytes"] / sim["compulsory"][f"{way}_bytes"]
        rows.append(row)
    if predictions is not None:
        join_predictions(rows, predictions)
    prefix = folder / "traffic" if prefix is None else prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_name(prefix.name + ".json").write_text(json.dumps(rows, indent=2) + "\n")
    source = (f"DRAM bytes measured by ncu ({folder / 'ncu.csv'}) against `iosim.count` at the kernel's B_r, B_c "
              f"and dtype; M = the SRAM those tiles need, in elements. MB = 10⁶ bytes; "
              f"once = each simulated tensor moved once "
              f"(Q, K, V read; O, ℓ, m written)."
              + (f" L2: the DRAM bytes the L2 model predicts in {predictions} (commit "
                 f"{json.loads(predictions.read_text()).get('commit')}; reads, and writes during the kernels)."
                 if predictions is not None else "") + "\n\n")
    prefix.with_name(prefix.name + ".md").write_text(source + markdown(rows))
    return rows


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def _ratio(x: float) -> str:
    """Three significant digits, trailing zeros kept (1.00, 0.0500), whole numbers from 100."""
    return f"{x:.0f}" if x >= 100 else f"{x:#.3g}"


def markdown(rows: list[dict]) -> str:
    l2 = any("dram_read_pred_bytes" in r for r in rows)
    head = (
        "| impl | dir | batch·heads | N | d | B_r×B_c | M | DRAM read MB | sim read MB | read meas/sim "
        "| read meas/once | DRAM write MB | sim write MB | write meas/sim | write meas/once |"
        + (" L2 read MB | read meas/L2 | L2 write MB | write meas/L2 |" if l2 else "") + "\n"
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        + (" ---: | ---: | ---: | ---: |" if l2 else "") + "\n"
    )
    lines = []
    for r in rows:
        m, sim = r["measured"], r.get("simulated")
        tile = f"{r['tiling']['Br']}×{r['tiling']['Bc']}"
        cells = [r["impl"], r["direction"], str(r["batch"] * r["heads"]), str(r["n_q"]), str(r["d"]), tile]
        cells.append(str(sim["M"]) if sim else "–")
        for way in ("read", "write"):
            cells.append(_mb(m[f"{way}_bytes"]))
            if sim:
                cells += [_mb(sim[f"{way}_bytes"]), _ratio(r[f"{way}_ratio"]), _ratio(r[f"{way}_over_compulsory"])]
            else:
                cells += ["–", "–", "–"]
        if l2 and "dram_read_pred_bytes" in r:
            write = r["dram_write_ratio"]
            cells += [_mb(r["dram_read_pred_bytes"]), _ratio(r["dram_read_ratio"]), _mb(r["dram_write_pred_bytes"]),
                      "–" if write is None else _ratio(write)]
        elif l2:
            cells += ["–"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p_launch = sub.add_parser("launch", help="run a grid's configurations once each (the program ncu profiles)")
    p_launch.add_argument("--grid", choices=sorted(GRIDS), default="traffic")
    p_launch.add_argument("--only", type=int, nargs="+", default=None, help="these configurations' indices only")
    p_profile = sub.add_parser("profile", help="run `launch` under ncu and keep its CSV")
    p_profile.add_argument("--grid", choices=sorted(GRIDS), default="traffic")
    p_profile.add_argument("--out", type=Path, required=True)
    p_profile.add_argument("--grouped", action="store_true",
                           help="one ncu process and CSV per kernel build, so that a cut run keeps what finished")
    p_profile.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="the ncu executable")
    p_compare = sub.add_parser("compare", help="measured / simulated from a profiled folder")
    p_compare.add_argument("folder", type=Path, help="a folder `profile` wrote: configs.json and ncu.csv")
    p_compare.add_argument("--out", type=Path, default=None,
                           help="write OUT.json and OUT.md (default: FOLDER/traffic.json and FOLDER/traffic.md)")
    p_compare.add_argument("--predictions", type=Path, default=None,
                           help="the L2 model's predictions made before the run (predictions-<commit>.json)")
    return parser


def run(args: argparse.Namespace):
    if args.step == "launch":
        return launch(GRIDS[args.grid](), args.only)
    if args.step == "profile":
        return profile(args.grid, args.out, args.ncu, args.grouped)
    return compare(args.folder, args.out, args.predictions)


def main() -> None:
    args = build_parser().parse_args()
    result = run(args)
    if args.step == "compare":
        print(markdown(result), end="")
    elif args.step == "profile":
        print(result)


if __name__ == "__main__":
    main()
