"""The one mapping of algorithm names: it feeds the API, the CLI, the sweep, the experiments and the tests.

Adding an algorithm is one module in ``iosim/algorithms/`` and one line here; an
algorithm defined elsewhere joins with ``register``.
"""

from __future__ import annotations

from iosim.algorithms import (
    block_sparse,
    block_sparse_skip,
    flash,
    flash_swapped,
    flex,
    small_cache,
    split_kv,
    standard,
    standard_eager,
)
from iosim.algorithms.algorithm import Algorithm
from iosim.core.errors import InputError

ALGORITHMS: dict[str, Algorithm] = {
    standard.ALGORITHM.name: standard.ALGORITHM,
    flash.ALGORITHM.name: flash.ALGORITHM,
    flash_swapped.ALGORITHM.name: flash_swapped.ALGORITHM,
    standard_eager.ALGORITHM.name: standard_eager.ALGORITHM,
    block_sparse.ALGORITHM.name: block_sparse.ALGORITHM,
    block_sparse_skip.ALGORITHM.name: block_sparse_skip.ALGORITHM,
    small_cache.ALGORITHM.name: small_cache.ALGORITHM,
    split_kv.ALGORITHM.name: split_kv.ALGORITHM,
    flex.ALGORITHM.name: flex.ALGORITHM,
}
DEFAULT = flash.ALGORITHM.name  # what `iosim run` simulates unless told otherwise


def register(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm to the registry, so that the API, the CLI and the sweep know it by name."""
    if not isinstance(algorithm, Algorithm):
        raise InputError(f"algorithm={algorithm!r} must be an iosim.Algorithm")
    if algorithm.name in ALGORITHMS:
        raise InputError(f"algorithm name {algorithm.name!r} is taken; registered: {sorted(ALGORITHMS)}")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def get_algorithm(algorithm: str | Algorithm) -> Algorithm:
    """The registered algorithm of that name, or the ``Algorithm`` itself when one is passed."""
    if isinstance(algorithm, Algorithm):
        return algorithm
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise InputError(f"algorithm={algorithm!r} is not one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[algorithm]


def baseline() -> Algorithm:
    """The algorithm the others are compared with (standard attention)."""
    return next(a for a in ALGORITHMS.values() if a.baseline)
