"""The GPU's DRAM level: the L2 between SRAM and DRAM, the schedule of thread blocks, and the kernels' grids."""
