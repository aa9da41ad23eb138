"""Which backend this llama-cpp-python build really runs on, from ggml's own device list.

llama-cpp-python compiles its backend at install time (CMAKE_ARGS), and pip may silently reuse a
cached CPU wheel: the only trustworthy answer is to ask the loaded library.  ggml's device API
(`ggml_backend_dev_*`) is not bound by llama-cpp-python, so it is bound here with ctypes; it is
exported by libggml, which libllama's handle reaches.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Device", "BackendInfo", "backend_info", "offload_warning"]

_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator", 4: "meta"}


@dataclass
class Device:
    name: str  # e.g. "CUDA0", "Vulkan0", "CPU"
    description: str  # e.g. "NVIDIA H200", the CPU model
    kind: str  # CPU, GPU, iGPU, accelerator, meta
    backend: str  # the registry: CPU, CUDA, ROCm, Vulkan, Metal, SYCL, ...
    memory_total: int = 0  # bytes (0: unknown)
    memory_free: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("GPU", "iGPU")


@dataclass
class BackendInfo:
    devices: list[Device] = field(default_factory=list)
    gpu_offload: bool = False  # llama_supports_gpu_offload()
    system_info: str = ""

    @property
    def gpus(self) -> list[Device]:
        return [d for d in self.devices if d.is_gpu]

    @property
    def name(self) -> str:
        """The compute backend: the GPU backends' names, else CPU."""
        names = sorted({d.backend for d in self.gpus})
        return "+".join(names) if names else "CPU"

    @property
    def gpu(self) -> str:
        return "; ".join(f"{d.description} ({d.name})" for d in self.gpus) or "none"

    @property
    def gpu_memory(self) -> str:
        if not self.gpus:
            return "none"
        return "; ".join(f"{d.memory_total / 2**30:.1f} GiB" if d.memory_total else "unknown" for d in self.gpus)

    def summary(self) -> str:
        """One line for the bench header."""
        devs = ", ".join(f"{d.name} ({d.description})" for d in self.devices) or "unknown"
        return f"{self.name} (llama.cpp devices: {devs}; GPU offload {'supported' if self.gpu_offload else 'not built in'})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "gpu_offload": self.gpu_offload,
            "devices": [d.__dict__ | {"is_gpu": d.is_gpu} for d in self.devices],
            "system_info": self.system_info,
        }


def _fn(lib: Any, name: str, restype: Any, argtypes: list[Any]) -> Any:
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, argtypes
    return f


def _text(p: Optional[bytes]) -> str:
    return p.decode("utf-8", errors="replace") if p else ""


def _devices() -> list[Device]:
    from llama_cpp import llama_cpp as ll

    lib = ll._lib
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    count = _fn(lib, "ggml_backend_dev_count", sz, [])
    get = _fn(lib, "ggml_backend_dev_get", vp, [sz])
    name = _fn(lib, "ggml_backend_dev_name", ctypes.c_char_p, [vp])
    desc = _fn(lib, "ggml_backend_dev_description", ctypes.c_char_p, [vp])
    kind = _fn(lib, "ggml_backend_dev_type", ctypes.c_int, [vp])
    memory = _fn(lib, "ggml_backend_dev_memory", None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)])
    reg = _fn(lib, "ggml_backend_dev_backend_reg", vp, [vp])
    reg_name = _fn(lib, "ggml_backend_reg_name", ctypes.c_char_p, [vp])
    out = []
    for i in range(int(count())):
        dev = get(i)
        if not dev:
            continue
        free, total = sz(0), sz(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        r = reg(dev)
        out.append(Device(_text(name(dev)), _text(desc(dev)).strip(), _DEV_TYPES.get(int(kind(dev)), "unknown"),
                          _text(reg_name(r)) if r else "unknown", int(total.value), int(free.value)))
    return out


def backend_info() -> BackendInfo:
    """Ask the loaded llama.cpp which devices it has; fields it cannot tell stay empty."""
    from llama_cpp import llama_cpp as ll

    from .._llama import ensure_backend

    ensure_backend()
    info = BackendInfo(gpu_offload=bool(ll.llama_supports_gpu_offload()),
                       system_info=_text(ll.llama_print_system_info()).strip())
    try:
        info.devices = _devices()
    except (AttributeError, OSError):  # a build without the device API: the system info line stays
        pass
    return info


def offload_warning(n_gpu_layers: Optional[int], info: BackendInfo) -> Optional[str]:
    """A warning when layers are asked to go to a GPU this build cannot use."""
    if not n_gpu_layers or info.gpu_offload and info.gpus:
        return None
    what = "all layers" if n_gpu_layers < 0 else f"{n_gpu_layers} layers"
    why = ("this llama-cpp-python build has no GPU backend (CPU only)" if not info.gpu_offload
           else "no GPU device was found")
    return (f"--n-gpu-layers asks to offload {what}, but {why}: everything runs on the CPU. "
            "Reinstall with a GPU backend, e.g. `make setup GPU=cuda` (see docs/gpus.md)")
