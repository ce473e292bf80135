"""What choosing a device sets up for the process: on CUDA, attention kept off cuDNN's kernels."""
from __future__ import annotations

import torch

from nmtkit.runtime import device as device_module


def test_a_cuda_device_keeps_attention_off_cudnn_and_a_cpu_leaves_it(monkeypatch):
    """cuDNN's attention builds a graph per new shape (115 ms each on an H100, docs/gpu.md);
    choosing a CUDA device turns it off and leaves flash and memory-efficient kernels on."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    device_module.shape_free_attention.cache_clear()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        assert device_module.resolve_device("cpu") == torch.device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()  # a CPU run changes nothing
        assert device_module.resolve_device("cuda:0") == torch.device("cuda:0")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
        device_module.shape_free_attention.cache_clear()
