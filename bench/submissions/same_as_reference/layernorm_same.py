"""The bundled layernorm reference's own module and initialisation: a speedup of 1 whatever
the host, for bench/under_load.py."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)
