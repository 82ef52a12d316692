"""Pure-PyTorch baseline for layernorm: mean and variance written out. The parameters are
created as the reference creates them (same order, same draws), so they hold the same values."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.norm.weight + self.norm.bias
