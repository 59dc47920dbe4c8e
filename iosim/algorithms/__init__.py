"""The attention algorithms, one module each, written against ``iosim.memory.Memory``."""
