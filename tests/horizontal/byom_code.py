"""A consortium's own code, as the user-model tests name it in job files (``tests.horizontal.byom_code:...``).

Plain torch and numpy, nothing from secureflhv: a small CNN with batch norm (parameters *and* buffers), a
training loop and an evaluation loop written the way a user would, and factories that fail in the ways
preflight must name.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class BNNet(nn.Module):
    """conv 3x3 (1 -> width) + BatchNorm2d + ReLU + 2x2 max-pool, then linear -> hidden + ReLU + linear -> classes,
    for (1, 8, 8) inputs."""

    def __init__(self, n_classes: int = 3, width: int = 4, hidden: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc1 = nn.Linear(width * 16, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def bn_net(n_classes: int = 3, width: int = 4, hidden: int = 8) -> nn.Module:
    """The model factory named by the jobs."""
    return BNNet(n_classes, width, hidden)


def raising_net(**_):
    """A factory whose code fails at the party."""
    raise RuntimeError("CUDA driver not found on this node")


def not_a_module(**_):
    """A factory that returns something other than a torch module."""
    return {"weights": [1, 2, 3]}


def train(model, loader, ctx):
    """The built-in loop's mathematics written by a user: SGD through ``ctx.optimizer()``, cross-entropy,
    ``ctx.epochs`` passes; returns the mean batch loss."""
    opt = ctx.optimizer()
    total, steps = 0.0, 0
    for _ in range(ctx.epochs):
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
    return {"loss": total / steps}


def train_adam(model, loader, ctx):
    """A user loop with its own optimiser (Adam), wrapped for the strategy."""
    opt = ctx.wrap(torch.optim.Adam(model.parameters(), lr=1e-3))
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def evaluate(model, loader, ctx):
    """Mean cross-entropy and accuracy over the loader."""
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x.to(ctx.device))
            loss += float(nn.functional.cross_entropy(out, y.to(ctx.device), reduction="sum"))
            correct += int((out.argmax(1).cpu() == y).sum())
            n += len(y)
    return {"loss": loss / n, "accuracy": correct / n}


def image_blobs(n_rows: int = 240, n_classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 (n, 1, 8, 8), y int64 (n,)): one noisy template image per class."""
    rng = np.random.default_rng(seed)
    templates = rng.normal(0, 1, (n_classes, 1, 8, 8))
    y = rng.integers(0, n_classes, n_rows)
    return (templates[y] + rng.normal(0, 0.5, (n_rows, 1, 8, 8))).astype(np.float32), y.astype(np.int64)
