"""iosim: the IO cost of attention, simulated, predicted and checked."""
