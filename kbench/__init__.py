"""kbench: grade custom kernels that replace PyTorch modules (KernelBench format)."""

__version__ = "0.4.0"
