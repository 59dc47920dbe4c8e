"""One-warp kernels that probe the tensor-core primitives of iosim.kernels._mma, as plain Python functions.

tests/test_kernels.py runs them (under the simulator in CI, on the GPU with IOSIM_GPU=1) and
tests/test_kernels_compile.py compiles them for sm_90, since the simulator neither types nor
lowers a kernel: call 4's GPU run found both failing to compile there (their shared arrays were
sized from a module attribute, which numba does not take as a constant). Each factory closes over
the sizes, so numba sees them as constants, and returns the function for `cuda.jit` to compile.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from iosim.kernels import _mma

LDMATRIX_WIDTH = 12  # words per shared row in ldmatrix_probe: 8 for 16 halves, plus padding that must not be read


def mma_probe(mma, pack):
    """warp_mma(a_words, b_words, c_lanes, d_lanes, packed): each lane's D fragment of one mma (A·B + C from the
    lanes' fragments), and two words packed by `pack` (lo 0 and hi 1.5; lo −2 and hi 1/3)."""
    scratch_words = _mma.SCRATCH_WORDS

    def warp_mma(a_w, b_w, c_l, d_l, pk):
        lane = cuda.threadIdx.x
        scratch = cuda.shared.array((32, scratch_words), np.uint32)
        d = mma(a_w[lane, 0], a_w[lane, 1], a_w[lane, 2], a_w[lane, 3], b_w[lane, 0], b_w[lane, 1],
                c_l[lane, 0], c_l[lane, 1], c_l[lane, 2], c_l[lane, 3], scratch)
        for i in range(4):
            d_l[lane, i] = d[i]
        pk[lane, 0] = pack(np.float32(0.0), np.float32(1.5))
        pk[lane, 1] = pack(np.float32(-2.0), np.float32(1.0 / 3.0))

    return warp_mma


def ldmatrix_probe():
    """load(src, a_out, b_out): a 16 × LDMATRIX_WIDTH word tile copied to shared memory, then each lane's words of
    ldmatrix.x4 over its four 8 × 8 quarters (A) and of ldmatrix.x4.trans over its two 8 × 8 halves of columns 0-7,
    named twice (B)."""
    width, scratch_words = LDMATRIX_WIDTH, _mma.SCRATCH_WORDS

    def load(src, a_out, b_out):
        lane = cuda.threadIdx.x
        tile = cuda.shared.array((16, width), np.uint32)
        scratch = cuda.shared.array((32, scratch_words), np.uint32)
        for w in range(width):
            if lane < 16:
                tile[lane, w] = src[lane, w]
        cuda.syncthreads()
        # A quarter i = lane // 8: rows 8·(i mod 2) …, columns 8·(i // 2) … (word 4·(i // 2))
        base = _mma.shared_address(tile, lane % 8 + 8 * (lane // 8 % 2), 4 * (lane // 16))
        a = _mma.ldmatrix_x4(tile, base, 0, scratch)
        # B (16 × 8, k rows): matrices 0 and 1 are rows 0-7 and 8-15 of columns 0-7; 2 and 3 the same
        base = _mma.shared_address(tile, lane % 8 + 8 * (lane // 8 % 2), 0)
        b = _mma.ldmatrix_x4_trans(tile, base, 0, scratch)
        for i in range(4):
            a_out[lane, i] = a[i]
            b_out[lane, i] = b[i]

    return load
