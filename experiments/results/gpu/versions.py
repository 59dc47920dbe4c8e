"""Print the device, driver and library versions a GPU result was measured with (JSON)."""

import json
import platform
from importlib.metadata import PackageNotFoundError, version


def versions() -> dict:
    import numba
    import numpy
    from numba import cuda

    info = {"python": platform.python_version(), "numpy": numpy.__version__, "numba": numba.__version__}
    for package in ("numba-cuda", "torch", "cuda-bindings", "nvidia-cuda-nvcc", "nvidia-nvjitlink"):
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = None
    device = cuda.get_current_device()
    info["device"] = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    info["compute_capability"] = list(device.compute_capability)
    info["multiprocessors"] = device.MULTIPROCESSOR_COUNT
    # what the presets' L2 and bandwidth are checked against (iosim/core/gpus.py): no datasheet gives the H200's or
    # the B200's memory data rate. A driver may no longer report the memory clock (CUDA 13 dropped it from
    # cudaDeviceProp): that is recorded, and the rest of the record still counts
    for key, attribute in (("l2_bytes", "L2_CACHE_SIZE"), ("memory_bus_bits", "GLOBAL_MEMORY_BUS_WIDTH"),
                           ("memory_clock_khz", "MEMORY_CLOCK_RATE")):
        try:
            info[key] = getattr(device, attribute)
        except (AttributeError, cuda.cudadrv.driver.CudaAPIError) as error:
            info[key] = f"unavailable: {error}"
    info["cuda_driver_api"] = list(cuda.cudadrv.driver.driver.get_version())
    info["cuda_runtime"] = list(cuda.runtime.get_version())
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    except ImportError:
        pass
    return info


if __name__ == "__main__":
    print(json.dumps(versions(), indent=2))
