"""Softmax with a temperature: softmax(x / temperature) along the last dimension of a
(batch, dim) tensor. Eager PyTorch runs it as two kernels (a scale, then softmax); one pass
over each row does both."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x / self.temperature, dim=-1)


batch_size = 4096
dim = 8192
temperature = 0.7


def get_inputs():
    return [torch.randn(batch_size, dim) * 3]


def get_init_inputs():
    return [temperature]
