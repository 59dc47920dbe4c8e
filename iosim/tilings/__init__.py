"""Choosing a tiling: the block policies and the optimizer's search over tilings."""
