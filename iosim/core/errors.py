"""The exceptions iosim raises for bad input: the CLI reports these, and only these, in one line.

Anything else that escapes the core is a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """A parameter is outside its allowed range; the message names the parameter, the value and the range."""


class InputTypeError(InputError, TypeError):
    """A parameter has the wrong type (an InputError that is also a TypeError)."""


class BlockSizeError(InputError):
    """No tiling of the chosen policy fits the SRAM, or an explicit tiling does not."""


class SearchTooLargeError(InputError):
    """The optimal tiling search would try more than it allows: ``iosim.tilings.search.MAX_BLOCK_SIZES`` block sizes a
    side, or ``MAX_EXHAUSTIVE`` tilings where a block mask makes it try every one."""
