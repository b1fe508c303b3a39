"""A hospital consortium's own model and training loops, as its members would write them: plain torch, nothing
from secureflhv. Every hospital installs this same file; the job names it (``params.model.factory:
"models:resnet8"`` with ``path`` this folder), and each party imports its own copy: no code travels.

* :func:`resnet8`: a CIFAR-style ResNet-8 (He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition",
  CVPR 2016, section 4.2: 6n+2 layers with n = 1) for (in_channels, 28, 28) images: 3x3 conv to 16 channels,
  batch norm, ReLU, then three stages of one basic block each (widths 16, 32, 64; stages 2 and 3 halve the
  resolution, with a 1x1 convolution + batch norm on the shortcut, the paper's option B), global average pool,
  linear to ``n_classes``. 77,754 parameters and 2 x 336 batch-norm running statistics for 10 classes and one
  channel. Input float32 (batch, in_channels, 28, 28), or flat rows (batch, in_channels*784); output
  (batch, n_classes) logits. The same architecture and ``state_dict`` names as ``benchmarks/byom_models.py``,
  so the two have the same parameter layout (``params.model.layout_hash``).
* :func:`train` / :func:`evaluate`: one round of local training and the evaluation, in the form
  ``params.train`` / ``params.evaluate`` take (``secureflhv.horizontal.user_loop``): SGD through
  ``ctx.optimizer()`` (the job's learning rate, momentum and weight decay; the framework adds what the
  strategy needs per step), cross-entropy, ``ctx.epochs`` passes over the loader.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

IMAGE_SIZE = 28


class BasicBlock(nn.Module):
    """Two 3x3 conv + batch-norm layers and a shortcut: identity, or a 1x1 conv + batch norm when the stride or
    the width changes (He et al. 2016, Fig. 2, option B)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet8(nn.Module):
    """CIFAR-style ResNet-8 for 28x28 images (module docstring)."""

    def __init__(self, n_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.in_channels = in_channels
        self.conv = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.fc = nn.Linear(64, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # flat rows, as a table of pixels would give them
            x = x.reshape(x.shape[0], self.in_channels, IMAGE_SIZE, IMAGE_SIZE)
        x = F.relu(self.bn(self.conv(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet8(n_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """A fresh ResNet-8 with torch's default initialisation, drawn from torch's global generator (the framework
    seeds it with the job's seed, so every party builds the same initial model)."""
    return ResNet8(n_classes, in_channels)


def train(model: nn.Module, loader, ctx) -> dict:
    """One round of local training: ``ctx.epochs`` passes of SGD (``ctx.optimizer()``) on cross-entropy.
    Returns the mean batch loss."""
    opt = ctx.optimizer()
    total, steps = 0.0, 0
    for _ in range(ctx.epochs):
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
    return {"loss": total / max(steps, 1)}


def evaluate(model: nn.Module, loader, ctx) -> dict:
    """Mean cross-entropy and accuracy over the loader (the model is in inference mode)."""
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x.to(ctx.device))
            loss += float(F.cross_entropy(out, y.to(ctx.device), reduction="sum"))
            correct += int((out.argmax(1).cpu() == y).sum())
            n += len(y)
    return {"loss": loss / max(n, 1), "accuracy": correct / max(n, 1)}
