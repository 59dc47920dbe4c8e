"""Warp-wide tensor-core primitives: D = A·B + C with A 16×16 and B 16×8 in float16 or bfloat16, C and D float32,
and the fragment loads and packing that feed it.

On a GPU `mma_16816` is PTX's `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`
(HMMA.16816.F32 on sm_80 and later) and `mma_16816_bf16` its `.f32.bf16.bf16.f32` form
(HMMA.16816.F32.BF16), emitted as inline assembly because Numba has no MMA API. Numba's
CUDA simulator cannot run inline PTX, so there the same functions are plain Python with
the same fragment semantics: each thread passes and receives exactly the elements the PTX
ISA assigns to its lane, so a kernel's data layout runs unchanged in CI.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"; the same for .f16 and .bf16),
for lane = 4·group + quad:
  - A, 16 × 16 row-major, four 2-half words a0…a3: word i holds rows group + 8·(i mod 2),
    columns 2·quad + 8·(i // 2) and that + 1 (low half first);
  - B, 16 × 8 column-major, two 2-half words b0, b1: word i holds rows 2·quad + 8·i and
    that + 1 of column group;
  - C and D, 16 × 8 float32, four values c0…c3: value i is row group + 8·(i // 2),
    column 2·quad + (i mod 2).
Every lane of the warp must call it together (it is a warp-synchronous instruction).

`ldmatrix_x4` and `ldmatrix_x4_trans` fill operand fragments from four 8 × 8 matrices of
16-bit values in shared memory, one warp-wide instruction (PTX's
ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16): lane 8i + r names the address of row r
of matrix i (`shared_address` of a shared array's element: the byte address in the shared
window on a GPU, the flat word index under the simulator), and value i of a lane holds
matrix i's halves at row group, columns 2·quad and 2·quad + 1 — or, transposed, rows
2·quad and 2·quad + 1 of column group. A row is 8 halves, 16-byte aligned.

`float_from_bits` reinterprets a uint32 as a float32 (a bfloat16 widens exactly by a shift).
`exp2` is the softmax's 2^x beside it: PTX's ex2.approx.ftz.f32, one MUFU.EX2 (relative
error about 2⁻²², results below 2⁻¹²⁶ flushed to 0), where math.exp2 adds a test and two
multiplies per call to keep those tiny results; the simulator's is math.exp2.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types, uint32

from iosim.kernels import _device as dev
from iosim.kernels.bfloat16 import from_bfloat16, to_bfloat16

M, N, K = 16, 8, 16  # the shape of one mma.sync.m16n8k16
WARP = 32
SCRATCH_WORDS = 6  # packed A and B words per lane that the simulator's version exchanges


def a_element(lane: int, word: int, half: int) -> tuple[int, int]:
    """(row, column) of A held in half `half` (0 low, 1 high) of A word `word` of `lane`."""
    group, quad = divmod(lane, 4)
    return group + 8 * (word % 2), 2 * quad + 8 * (word // 2) + half


def b_element(lane: int, word: int, half: int) -> tuple[int, int]:
    """(row k, column n) of B held in half `half` of B word `word` of `lane`."""
    group, quad = divmod(lane, 4)
    return 2 * quad + 8 * word + half, group


def c_element(lane: int, i: int) -> tuple[int, int]:
    """(row, column) of C and D held in value i of `lane`."""
    group, quad = divmod(lane, 4)
    return group + 8 * (i // 2), 2 * quad + i % 2


@cuda.jit(device=True)
def join_halves(lo, hi):
    """The 2-half word of two 16-bit patterns (uint16), lo in the low half: bfloat16 tiles pack without rounding."""
    return uint32(lo) | (uint32(hi) << uint32(16))


def _simulated_mma(decode):
    """mma_16816 as Python for the halves' type: decode maps (…, 2) uint16 patterns to their float values."""
    lanes = np.arange(WARP)[:, None, None]
    words, half = np.arange(4)[None, :, None], np.arange(2)[None, None, :]
    a_rows, a_cols = np.broadcast_arrays(*a_element(lanes, words, half))  # (32, 4, 2) each
    b_rows, b_cols = np.broadcast_arrays(*b_element(lanes, words[:, :2], half))  # (32, 2, 2)

    @cuda.jit(device=True)
    def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch):
        """(d0, d1, d2, d3) = this lane's fragment of A·B + C; scratch is (threads, 6) uint32 shared.

        The block's threads all call it together: two block barriers surround the exchange.
        """
        tid = cuda.threadIdx.x
        lane = tid % WARP
        first = tid - lane
        for w, word in enumerate((a0, a1, a2, a3, b0, b1)):
            scratch[tid, w] = word
        cuda.syncthreads()
        bits = np.ascontiguousarray(scratch[first:first + WARP]).view(np.uint16).reshape(WARP, SCRATCH_WORDS, 2)
        halves = decode(bits)
        a = np.zeros((M, K))
        b = np.zeros((K, N))
        a[a_rows, a_cols] = halves[:, :4]
        b[b_rows, b_cols] = halves[:, 4:]
        cuda.syncthreads()
        out = []
        for i, c in enumerate((c0, c1, c2, c3)):
            r, n = c_element(lane, i)
            # products of float16 or bfloat16 values are exact in float64; one rounding to float32 at the end
            out.append(np.float32(np.dot(a[r, :], b[:, n]) + np.float64(c)))
        return out[0], out[1], out[2], out[3]

    return mma_16816


def _simulator_functions():
    """The primitives as Python (fragments and row addresses exchanged in shared scratch)."""

    @cuda.jit(device=True)
    def pack_half2(lo, hi):
        """The f16x2 word of (lo, hi), each rounded to nearest float16; lo in the low half."""
        halves = np.array([lo, hi], dtype=np.float32).astype(np.float16)
        return np.uint32(halves.view(np.uint32)[0])

    @cuda.jit(device=True)
    def pack_bfloat162(lo, hi):
        """The bf16x2 word of (lo, hi), each rounded to nearest bfloat16, ties to even; lo in the low half."""
        return np.uint32(to_bfloat16(np.array([lo, hi], dtype=np.float32)).view(np.uint32)[0])

    def float16_values(bits):
        return bits.view(np.float16)

    @cuda.jit(device=True)
    def exp2(x):
        """2^x in float32."""
        return np.float32(math.exp2(x))

    @cuda.jit(device=True)
    def float_from_bits(bits):
        """The float32 whose bits are the uint32 `bits`."""
        return np.array([bits], np.uint32).view(np.float32)[0]

    @cuda.jit(device=True)
    def shared_address(arr, row, col):
        """Where ldmatrix finds element (row, col) of a 2-D uint32 shared array: its flat word index."""
        return np.uint32(row * arr.shape[1] + col)

    def simulated_ldmatrix(trans):
        @cuda.jit(device=True)
        def ldmatrix(arr, base, offset, scratch):
            """The four words this lane receives from the rows the warp's lanes name at base + offset words."""
            tid = cuda.threadIdx.x
            lane = tid % WARP
            first = tid - lane
            scratch[tid, 0] = base + offset
            cuda.syncthreads()
            rows = [int(scratch[first + other, 0]) for other in range(WARP)]
            cuda.syncthreads()
            words = arr.reshape(-1)
            group, quad = divmod(lane, 4)
            out = []
            for i in range(4):
                if trans:
                    halves = words.view(np.uint16)
                    lo = halves[2 * rows[8 * i + 2 * quad] + group]
                    hi = halves[2 * rows[8 * i + 2 * quad + 1] + group]
                    out.append(np.uint32(lo) | (np.uint32(hi) << np.uint32(16)))
                else:
                    out.append(np.uint32(words[rows[8 * i + group] + quad]))
            return out[0], out[1], out[2], out[3]

        return ldmatrix

    return (pack_half2, pack_bfloat162, _simulated_mma(float16_values), _simulated_mma(from_bfloat16), exp2,
            float_from_bits, shared_address, simulated_ldmatrix(False), simulated_ldmatrix(True))


def _gpu_functions():
    """The primitives as inline PTX."""
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    f32, u32, u64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def pack_intrinsic(ptx_type):
        @intrinsic
        def pack(typingctx, lo, hi):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, signature, args):
                # cvt.rn.<type>x2.f32 d, a, b puts a in the high half and b in the low half
                asm = ir.InlineAsm(ir.FunctionType(u32, [f32, f32]), f"cvt.rn.{ptx_type}x2.f32 $0, $2, $1;", "=r,f,f")
                return builder.call(asm, [args[0], args[1]])

            return sig, codegen

        return pack

    def mma_device_function(ptx_type):
        @intrinsic
        def mma_intrinsic(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            result = types.UniTuple(types.float32, 4)
            sig = result(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, signature, args):
                out = ir.LiteralStructType([f32] * 4)
                asm = ir.InlineAsm(
                    ir.FunctionType(out, [u32] * 6 + [f32] * 4),
                    f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32 "
                    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                    "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
                )
                d = builder.call(asm, list(args))
                return context.make_tuple(builder, result, [builder.extract_value(d, i) for i in range(4)])

            return sig, codegen

        @cuda.jit(device=True, **dev.inline_options())
        def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch):
            """(d0, d1, d2, d3) = this lane's fragment of A·B + C (scratch is the simulator's; unused here)."""
            return mma_intrinsic(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

        return mma_16816

    @intrinsic
    def exp2(typingctx, x):
        sig = types.float32(types.float32)

        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(f32, [f32]), "ex2.approx.ftz.f32 $0, $1;", "=f,f")
            return builder.call(asm, [args[0]])

        return sig, codegen

    @intrinsic
    def float_from_bits(typingctx, bits):
        sig = types.float32(types.uint32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], f32)

        return sig, codegen

    @intrinsic
    def shared_address(typingctx, arr, row, col):
        sig = types.uint32(arr, row, col)

        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            array = context.make_array(array_type)(context, builder, value=args[0])
            index = [context.cast(builder, a, t, types.intp) for a, t in zip(args[1:], signature.args[1:])]
            pointer = cgutils.get_item_pointer(context, builder, array_type, array, index)
            generic = builder.ptrtoint(pointer, u64)
            asm = ir.InlineAsm(ir.FunctionType(u32, [u64]),
                               "{ .reg .u64 s; cvta.to.shared.u64 s, $1; cvt.u32.u64 $0, s; }", "=r,l")
            return builder.call(asm, [generic])

        return sig, codegen

    def ldmatrix_device_function(trans):
        @intrinsic
        def ldmatrix_intrinsic(typingctx, address):
            result = types.UniTuple(types.uint32, 4)
            sig = result(types.uint32)

            def codegen(context, builder, signature, args):
                out = ir.LiteralStructType([u32] * 4)
                # side_effect and the memory clobber keep it between the barriers around it
                asm = ir.InlineAsm(
                    ir.FunctionType(out, [u32]),
                    f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 {{$0, $1, $2, $3}}, [$4];",
                    "=r,=r,=r,=r,r,~{memory}",
                    side_effect=True,
                )
                d = builder.call(asm, [args[0]])
                return context.make_tuple(builder, result, [builder.extract_value(d, i) for i in range(4)])

            return sig, codegen

        @cuda.jit(device=True, **dev.inline_options())
        def ldmatrix(arr, base, offset, scratch):
            """The four words this lane receives from the rows the warp's lanes name at base + 4·offset bytes."""
            return ldmatrix_intrinsic(base + uint32(4 * offset))

        return ldmatrix

    return (pack_intrinsic("f16"), pack_intrinsic("bf16"), mma_device_function("f16"), mma_device_function("bf16"),
            exp2, float_from_bits, shared_address, ldmatrix_device_function(False), ldmatrix_device_function(True))


(pack_half2, pack_bfloat162, mma_16816, mma_16816_bf16, exp2, float_from_bits, shared_address, ldmatrix_x4,
 ldmatrix_x4_trans) = (
    _simulator_functions() if dev.simulator_enabled() else _gpu_functions()
)
