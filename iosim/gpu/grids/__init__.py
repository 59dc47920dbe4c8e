"""One module per kernel of kernels/ (named as kernels/api.py names the implementations), each declaring its
kernels' grids of thread blocks as they launch: the mapping of an algorithm onto the GPU that the DRAM level runs."""
