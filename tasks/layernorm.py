"""Layer normalisation over the last dimension, with a learned weight and bias (drawn at
construction, so a kernel that ignores them is wrong)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 64
seq_len = 512
features = 1024
eps = 1e-5


def get_inputs():
    return [torch.randn(batch_size, seq_len, features)]


def get_init_inputs():
    return [features, eps]
