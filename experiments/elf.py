"""The section sizes of a cubin (a 64-bit little-endian ELF file), read from its section headers.

experiments/kernel_resources.py reads the code of iosim's kernels from the cubins nvJitLink assembles, and
experiments/sdpa_resources.py that of torch's flash kernels from the cubins cuobjdump extracts from its library.
"""

from __future__ import annotations

import struct


def elf_sections(blob: bytes) -> dict[str, int]:
    """The size in bytes of each section of a 64-bit little-endian ELF file, by name."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    if shnum == 0 or shstrndx == 0xFFFF:  # more sections than the header counts: their number is elsewhere
        raise ValueError("an ELF file with extended section numbering, which this reader does not follow")
    headers = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        return blob[names_at + offset:blob.index(b"\0", names_at + offset)].decode()

    return {name(h[0]): h[5] for h in headers}
