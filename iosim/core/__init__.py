"""The values every layer shares: sizes and errors, counts, the problem and its tiling, the visited tiles, the
two-level memory, dropout's random numbers, input checks and GPU presets."""
