"""The attention algorithms, one module each, written against ``iosim.core.memory.Memory``."""
