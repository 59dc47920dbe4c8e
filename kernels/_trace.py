"""Where and when a thread block ran: its SM (%smid) and the GPU's global nanosecond timer (%globaltimer).

A traced kernel (``flash_swapped.forward_kernel(..., trace=True)``) stamps, from thread 0 of each block, the SM it
ran on, the timer when the block started and the timer after its last store, into a uint64 array of 3 words per
block. The stamps are the block schedule the GPU really ran, which iosim.gpu's schedules (lockstep, timed) model:
experiments/block_trace.py reads them.

%globaltimer is a 64-bit nanosecond counter shared by the SMs (PTX ISA, "Special Registers": %globaltimer); its
resolution on recent GPUs is 32 ns to 1 µs, so the stamps order blocks to that resolution. Under Numba's CUDA
simulator there is no SM: ``sm_id`` is 0 and ``global_timer`` the host's nanosecond clock.
"""

from __future__ import annotations

import time

import numpy as np
from numba import cuda

from iosim.kernels import _device as dev

STAMPS_PER_BLOCK = 3  # SM, start, end


def _simulator_functions():
    @cuda.jit(device=True)
    def sm_id():
        return np.uint64(0)

    @cuda.jit(device=True)
    def global_timer():
        return np.uint64(time.perf_counter_ns())

    return sm_id, global_timer


def _gpu_functions():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def special_register(ptx: str, bits: int):
        @intrinsic
        def read(typingctx):
            sig = types.uint64()

            def codegen(context, builder, signature, args):
                # side effect: two reads of a clock are not one value the compiler may merge or move
                asm = ir.InlineAsm(ir.FunctionType(ir.IntType(bits), []), ptx, "=r" if bits == 32 else "=l",
                                   side_effect=True)
                value = builder.call(asm, [])
                return builder.zext(value, ir.IntType(64)) if bits == 32 else value

            return sig, codegen

        return read

    return special_register("mov.u32 $0, %smid;", 32), special_register("mov.u64 $0, %globaltimer;", 64)


sm_id, global_timer = _simulator_functions() if dev.simulator_enabled() else _gpu_functions()


@cuda.jit(device=True, **dev.inline_options())
def stamp(stamps, block, start):
    """Thread 0 of `block` writes (SM, start, now) to stamps[3·block : 3·block + 3]."""
    if cuda.threadIdx.x == 0:
        base = block * STAMPS_PER_BLOCK
        stamps[base] = sm_id()
        stamps[base + 1] = start
        stamps[base + 2] = global_timer()
