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
