"""An embedding lookup: integer token ids in, their rows of a learned table out."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab_size: int, embedding_dim: int):
        super().__init__()
        self.table = nn.Embedding(vocab_size, embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


batch_size = 64
seq_len = 512
vocab_size = 32000
embedding_dim = 1024


def get_inputs():
    return [torch.randint(0, vocab_size, (batch_size, seq_len))]


def get_init_inputs():
    return [vocab_size, embedding_dim]
