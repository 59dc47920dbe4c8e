"""Block-sparse FlashAttention that never loads a key block whose column of tiles is all zero.

The same as ``block-sparse`` (``block_sparse.py``), except that its outer loop tests
the column first: K_j and V_j of an empty column are not read, and in the backward
pass dK_j and dV_j stay as Alg. 4 line 5 zeroed them, without line 24's write.
"""

from __future__ import annotations

from iosim.algorithms.block_sparse import variant

ALGORITHM = variant("block-sparse-skip", skips_empty_columns=True)
