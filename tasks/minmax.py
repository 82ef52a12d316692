"""Two outputs: each row's smallest and largest value of a (batch, dim) tensor. Eager PyTorch
reads the input twice (two reductions); one pass gives both."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.amin(dim=1), x.amax(dim=1)


batch_size = 8192
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
