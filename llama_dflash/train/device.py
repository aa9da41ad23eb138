"""Where training runs: device choice, mixed precision, and data-parallel processes.

Data parallelism uses PyTorch's own torch.distributed (gloo on CPU, nccl on CUDA): every process
draws its own batches, gradients are averaged with one all-reduce per step, so every rank holds
the same weights. Start it with `torchrun --nproc-per-node N -m llama_dflash.train ...`
(torchrun sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Iterable

import torch

from . import DEVICES

__all__ = ["DEVICES", "resolve_device", "autocast", "Dist", "init_distributed", "param_checksum"]


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """auto: CUDA if present, else Apple MPS, else CPU. An unavailable device is an error."""
    if name not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, not {name!r}")
    has_mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: PyTorch sees no CUDA device (torch.cuda.is_available() is false)")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if name == "mps" and not has_mps:
        raise ValueError("--device mps: PyTorch sees no Apple MPS device")
    return torch.device(name)


def autocast(device: torch.device, enabled: bool = True):
    """bf16 autocast on CUDA (the matmuls dominate; master weights stay f32); nothing elsewhere."""
    if enabled and device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast("cuda", dtype=dtype)
    return contextlib.nullcontext()


@dataclass
class Dist:
    """This process's place in a data-parallel group (world 1: no group)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def broadcast_params(self, params: Iterable[torch.Tensor]) -> None:
        """Start every rank from rank 0's weights."""
        if self.active:
            for p in params:
                torch.distributed.broadcast(p.data, src=0)

    def average_grads(self, params: list[torch.Tensor]) -> None:
        """Mean gradient over the ranks, in one flat all-reduce."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= self.world
        off = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[off : off + n].view_as(p).clone()
            off += n

    def mean(self, value: float, device: torch.device) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        return float(t) / self.world

    def gather_floats(self, value: float, device: torch.device) -> list[float]:
        if not self.active:
            return [value]
        t = torch.tensor([value], dtype=torch.float64, device=device)
        out = [torch.zeros_like(t) for _ in range(self.world)]
        torch.distributed.all_gather(out, t)
        return [float(x) for x in out]

    def close(self) -> None:
        """Leave the group together: a rank that tears gloo down while another still talks to
        it aborts ("terminate called without an active exception")."""
        if self.active and torch.distributed.is_initialized():
            try:
                torch.distributed.barrier()
            finally:
                torch.distributed.destroy_process_group()


def init_distributed(device_name: str = "auto", timeout_minutes: float = 180.0) -> Dist:
    """Join the group torchrun describes in the environment (WORLD_SIZE > 1), else a world of 1.
    The long timeout covers rank 0 building the data cache while the others wait."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    backend = "nccl" if device_name in ("auto", "cuda") and torch.cuda.is_available() else "gloo"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return Dist(rank=rank, world=world, local_rank=local)


def param_checksum(params: Iterable[torch.Tensor]) -> float:
    """A number that differs when any weight differs (to check ranks agree)."""
    total = 0.0
    for i, p in enumerate(params):
        total += float((p.detach().double().cpu() * (1.0 + 1e-3 * i)).sum())
    return total

