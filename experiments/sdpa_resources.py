"""The sm_90 resource usage of torch SDPA's flash kernels, read from torch's shipped CUDA library.

    python -m experiments.sdpa_resources --torch-lib PATH/libtorch_cuda.so [--cuobjdump PATH]
                                        [--out iosim/gpu/sdpa_resources_sm90.json]

Issue 28, item 1: the occupancy of the description of SDPA's flash backend (``iosim/gpu/grids/sdpa_flash.py``) from the
binary users run, not from published sm_80 ptxas reports. This runs ``cuobjdump --dump-resource-usage
--gpu-architecture sm_90`` on ``libtorch_cuda.so``, demangles each function name with ``c++filt`` and keeps the
FlashAttention-2 kernels the description launches: ``flash_fwd_kernel`` at its forward tiles, the split-KV forward's
``flash_fwd_splitkv_kernel`` and ``flash_fwd_splitkv_combine_kernel`` at theirs, and the backward's
``flash_bwd_dot_do_o_kernel``, ``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`` and ``flash_bwd_convert_dq_kernel`` at
its backward tiles, each instantiation (dtype and template flags; one built in two files, once) with its registers
per thread, its stack frame per thread (bytes of local memory for spills and calls), its static shared memory and its
constant bank 0. Template
flags are named as torch's vendored source names them (``flash_fwd_launch_template.h``, ``flash_bwd_launch_template.h``
in ``aten/src/ATen/native/transformers/cuda/flash_attn/``, the order of flash-attention's ``csrc/flash_attn/src/``).

Where torch is not installed this needs ``pip install torch`` (a CUDA build) and ``pip install nvidia-cuda-cuobjdump``;
on this project's container a venv: ``python -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.14.1
nvidia-cuda-cuobjdump``, then ``--torch-lib /tmp/tv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so
--cuobjdump /tmp/tv/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import tempfile
from datetime import date
from pathlib import Path

from experiments.elf import elf_sections

# the description's tiles (iosim/gpu/grids/sdpa_flash.py): d -> Flash_fwd_kernel_traits' (kHeadDim, kBlockM, kBlockN,
# kNWarps) and Flash_bwd_kernel_traits' (kHeadDim, kBlockM, kBlockN, kNWarps)
FORWARD_TRAITS = {(64, 128, 128, 4), (128, 128, 64, 4), (64, 64, 256, 4), (128, 64, 128, 4)}  # unsplit, split-KV
BACKWARD_TRAITS = {(64, 128, 128, 8), (128, 64, 128, 8)}
FLAGS = {  # each kernel's boolean template parameters, in order
    "flash_fwd_kernel": ("Is_dropout", "Is_causal", "Is_local", "Has_alibi", "Is_even_MN", "Is_even_K", "Is_softcap",
                         "Return_softmax"),
    "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel": ("Is_dropout", "Is_causal", "Is_local", "Has_alibi", "Is_even_MN",
                                                     "Is_even_K", "Is_softcap"),
    "flash_bwd_dot_do_o_kernel": ("Clear_dQaccum",),
    "flash_bwd_convert_dq_kernel": (),
    "flash_fwd_splitkv_kernel": ("Is_causal", "Is_local", "Has_alibi", "Is_even_MN", "Is_even_K", "Is_softcap", "Split",
                                 "Append_KV"),
    "flash_fwd_splitkv_combine_kernel": ("Is_even_K",),  # after its ints kBlockM and Log_max_splits
}
SPLIT_KERNELS = ("flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel")
NAME = re.compile(r"void pytorch_flash::(\w+)<((?:(?:true|false), )*)"
                  r"(?:pytorch_flash::)?Flash_(fwd|bwd)_kernel_traits<([^>]*)>")
RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+) CONSTANT\[0\]:(\d+)")
DEFAULT_OUT = Path("iosim/gpu/sdpa_resources_sm90.json")


def functions(dump: str) -> list[tuple[str, str]]:
    """(mangled name, its resource line) of every function of cuobjdump's dump."""
    lines = dump.splitlines()
    return [(line.strip()[len("Function "):].rstrip(":"), lines[i + 1].strip()) for i, line in enumerate(lines)
            if line.strip().startswith("Function ") and i + 1 < len(lines)]


def code_of(torch_lib: Path, cuobjdump: str, dump: str, wanted: set[str]) -> dict[str, int]:
    """The machine code (its ``.text`` section) of each mangled function in ``wanted``: the dump lists the library's
    sm_90 and sm_90a cubins in the order ``cuobjdump --list-elf`` names them; each cubin holding one is extracted and
    its section headers read (``experiments.elf``)."""
    names = [line.split(": ")[1].strip() for line in subprocess.run(
        [cuobjdump, "--list-elf", str(torch_lib)], capture_output=True, text=True, check=True).stdout.splitlines()
        if re.search(r"\.sm_90a?\.cubin$", line.strip())]
    cubins = dump.split("Fatbin elf code:")[1:]
    archs = [re.search(r"arch = (\S+)", c).group(1) for c in cubins]
    if archs != [n.split(".")[-2] for n in names]:
        raise RuntimeError(f"the resource dump's {len(cubins)} cubins are not the {len(names)} sm_90 ELF files listed")
    text = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, cubin in zip(names, cubins):
            held = {f for f, _ in functions(cubin)} & wanted
            if not held:
                continue
            subprocess.run([cuobjdump, "--extract-elf", name, str(torch_lib)], cwd=folder, check=True,
                           capture_output=True)
            sections = elf_sections((Path(folder) / name).read_bytes())
            if not {f for f, _ in functions(cubin)} <= {n[len(".text."):] for n in sections if n.startswith(".text.")}:
                raise RuntimeError(f"{name} does not hold the functions the dump lists for it: a misaligned cubin")
            text.update({f: sections[f".text.{f}"] for f in held})
    return text


def demangled(names: list[str]) -> list[str]:
    return subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                          check=True).stdout.splitlines()


def row(name: str, resources: str) -> dict | None:
    """A kept kernel's record, or None for a kernel or tile the description does not launch."""
    found = NAME.search(name)
    if found is None or found.group(1) not in FLAGS:
        return None
    kernel, traits = found.group(1), [x.strip() for x in found.group(4).split(",")]
    dims = tuple(int(x) for x in traits[:4])
    if dims not in (FORWARD_TRAITS if found.group(3) == "fwd" else BACKWARD_TRAITS) or (
            kernel in SPLIT_KERNELS) != (found.group(3) == "fwd" and dims[1] == 64):
        return None
    dtype = "bfloat16" if "bfloat16_t" in found.group(4) else "float16"
    tail = name[name.index(">", found.end()) + 1:]  # the kernel's own template arguments after its traits
    flags = re.findall(r"\b(true|false)\b", found.group(2) + tail[:tail.rindex(">")])
    reg, stack, shared, local, constant = (int(x) for x in RESOURCES.search(resources).groups())
    ints = re.match(r", (\d+), (\d+),", tail) if kernel == "flash_fwd_splitkv_combine_kernel" else None
    extra = {} if ints is None else {"combine_block_m": int(ints.group(1)), "log_max_splits": int(ints.group(2))}
    return dict(kernel=kernel, head_dim=dims[0], block_m=dims[1], block_n=dims[2], warps=dims[3], dtype=dtype,
                traits=traits[:9], flags=dict(zip(FLAGS[kernel], (f == "true" for f in flags))), **extra,
                registers=reg, stack_bytes=stack, static_shared_bytes=shared, local_bytes=local,
                constant_bank0_bytes=constant)


def collect(torch_lib: Path, cuobjdump: str) -> dict:
    dump = subprocess.run([cuobjdump, "--dump-resource-usage", "--gpu-architecture", "sm_90", str(torch_lib)],
                          capture_output=True, text=True, check=True).stdout
    found = functions(dump)
    kept = [(mangled, r) for (mangled, _), r in zip(found, (row(n, res) for n, res in zip(
        demangled([n for n, _ in found]), (r for _, r in found)))) if r is not None]
    text = code_of(torch_lib, cuobjdump, dump, {mangled for mangled, _ in kept})
    rows = [{**r, "text_bytes": text[mangled], "code_bytes": text[mangled] + r["constant_bank0_bytes"]}
            for mangled, r in kept]
    rows = list({json.dumps(r, sort_keys=True): r for r in rows}.values())  # a kernel built in two files: once
    version = subprocess.run([cuobjdump, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return dict(source=str(torch_lib.name), torch_lib_sha256=hashlib.sha256(torch_lib.read_bytes()).hexdigest(),
                torch_version=_torch_version(torch_lib), cuobjdump=version[-1] if version else None,
                architecture="sm_90", read_on=date.today().isoformat(),
                command=f"cuobjdump --dump-resource-usage --gpu-architecture sm_90 {torch_lib.name}; cuobjdump "
                        f"--extract-elf of the cubins holding the kernels (their .text sections)",
                rows=sorted(rows, key=lambda r: (r["kernel"], r["head_dim"], r["dtype"], sorted(r["flags"].items()),
                                                 r.get("log_max_splits", 0))))


def _torch_version(torch_lib: Path) -> str | None:
    """torch's version.py beside its lib folder, where it is there."""
    version = torch_lib.parent.parent / "version.py"
    if not version.exists():
        return None
    found = re.search(r"__version__ = '([^']+)'", version.read_text())
    return found.group(1) if found else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch-lib", type=Path, required=True, help="torch's libtorch_cuda.so")
    parser.add_argument("--cuobjdump", default="cuobjdump")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = collect(args.torch_lib, args.cuobjdump)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result['rows'])} kernels of torch {result['torch_version']} written to {args.out}")


if __name__ == "__main__":
    main()
