"""A consortium's own torch modules for the split NN tests (issue 37): what a job names with
``host_bottom_factory`` / ``guest_bottom_factory`` / ``top_factory``. Each factory is called as
``factory(**kwargs, in_features=d, out_features=k)``; plain torch only."""
from __future__ import annotations

import torch
from torch import nn


class ConvBottom(nn.Module):
    """(b, d) rows as a one-channel sequence: Conv1d over the feature axis, tanh, LayerNorm, Linear -> (b, k)."""

    def __init__(self, in_features: int, out_features: int, channels: int = 2, kernel: int = 3):
        super().__init__()
        width = channels * (in_features - kernel + 1)
        self.conv = nn.Conv1d(1, channels, kernel)
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(torch.tanh(self.conv(x.unsqueeze(1))).flatten(1)))


def conv_bottom(in_features: int, out_features: int, channels: int = 2, kernel: int = 3) -> nn.Module:
    """A :class:`ConvBottom`."""
    return ConvBottom(in_features, out_features, channels, kernel)


def norm_bottom(in_features: int, out_features: int, hidden: int = 5) -> nn.Module:
    """LayerNorm of the raw rows, then Linear, tanh, Linear."""
    return nn.Sequential(nn.LayerNorm(in_features), nn.Linear(in_features, hidden), nn.Tanh(),
                         nn.Linear(hidden, out_features))


def two_layer_top(in_features: int, out_features: int, hidden: int = 4, dropout: float = 0.0) -> nn.Module:
    """Linear, ReLU, Dropout, Linear."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, out_features))


def fixed_width(in_features: int, out_features: int, width: int = 3) -> nn.Module:
    """A Linear to ``width`` outputs whatever the job declares (a module that does not fit its job)."""
    return nn.Linear(in_features, width)


def wrong_input(in_features: int, out_features: int) -> nn.Module:
    """A Linear expecting one more input column than the party has (its forward pass raises)."""
    return nn.Linear(in_features + 1, out_features)


def broken(in_features: int, out_features: int, **kwargs) -> nn.Module:
    """A factory that raises."""
    raise RuntimeError("this factory needs a GPU")


def not_a_module(in_features: int, out_features: int):
    """A factory that returns something else than a module."""
    return [in_features, out_features]
