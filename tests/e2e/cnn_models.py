"""Held-out torchvision-style CNNs, written here (no torchvision dependency): MobileNetV2, ShuffleNetV2,
DenseNet, SqueezeNet and a ResNeXt with squeeze-excitation, small (64x64 images, batch 8, a few
blocks each) but with the layer mix of the originals: inverted residuals with ReLU6 and depthwise
convolutions, channel shuffles and splits, dense concatenations, fire modules with ceil-mode
pooling, grouped convolutions with SE gates; BatchNorm everywhere but SqueezeNet. The project does
not tune against them; `python -m benchmarks.models --cnn` measures them (inference and a training
step) against eager and torch.compile, and tests/e2e/test_cnn_models.py checks Kiln's values.

`CNN_MODELS` maps a name to a `RealModel` (tests/e2e/real_models.py), inputs keyword `x`.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.e2e.real_models import RealModel

IMAGE, BATCH, CLASSES = 64, 8, 10


def conv_bn_act(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                act: Callable[..., nn.Module] = nn.ReLU) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(conv_bn_act(cin, hidden, 1, act=nn.ReLU6),
                                  conv_bn_act(hidden, hidden, 3, stride, hidden, act=nn.ReLU6),
                                  nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = [(16, 1, 1), (24, 2, 6), (24, 1, 6), (32, 2, 6), (32, 1, 6), (64, 2, 6), (64, 1, 6)]
        layers: list[nn.Module] = [conv_bn_act(3, 16, 3, 2, act=nn.ReLU6)]
        channels = 16
        for cout, stride, expand in config:
            layers.append(InvertedResidual(channels, cout, stride, expand))
            channels = cout
        self.features = nn.Sequential(*layers, conv_bn_act(channels, 256, 1, act=nn.ReLU6))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(256, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous().view(b, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = channels if stride == 2 else channels // 2
        if stride == 2:
            self.left = nn.Sequential(nn.Conv2d(channels, channels, 3, 2, 1, groups=channels, bias=False),
                                      nn.BatchNorm2d(channels), conv_bn_act(channels, channels, 1))
        self.right = nn.Sequential(conv_bn_act(branch, branch, 1),
                                   nn.Conv2d(branch, branch, 3, stride, 1, groups=branch, bias=False),
                                   nn.BatchNorm2d(branch), conv_bn_act(branch, branch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            kept, changed = x.chunk(2, dim=1)
            out = torch.cat((kept, self.right(changed)), 1)
        else:
            out = torch.cat((self.left(x), self.right(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn_act(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1))
        self.stages = nn.Sequential(ShuffleUnit(24, 2), ShuffleUnit(48, 1), ShuffleUnit(48, 2), ShuffleUnit(96, 1),
                                    ShuffleUnit(96, 1))
        self.fc = nn.Linear(96, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.stages(self.stem(x)).mean([2, 3]))


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.conv2 = nn.BatchNorm2d(4 * growth), nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        return self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))


class DenseNet(nn.Module):
    def __init__(self, growth: int = 12) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 3, 1, 1, bias=False)
        channels = 24
        self.blocks, self.transitions = nn.ModuleList(), nn.ModuleList()
        for _ in range(2):
            self.blocks.append(nn.ModuleList(DenseLayer(channels + i * growth, growth) for i in range(4)))
            channels += 4 * growth
            self.transitions.append(nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(),
                                                  nn.Conv2d(channels, channels // 2, 1, bias=False), nn.AvgPool2d(2)))
            channels //= 2
        self.fc = nn.Linear(channels, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layers, transition in zip(self.blocks, self.transitions):
            features = [x]
            for layer in layers:
                features.append(layer(features))
            x = transition(torch.cat(features, 1))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1, self.expand3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1(x)), F.relu(self.expand3(x))], 1)


class SqueezeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      Fire(32, 8, 32), Fire(64, 8, 32), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      Fire(64, 16, 64))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(128, CLASSES, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, channels // reduction, 1), nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True)))))


class ResNeXtBlock(nn.Module):
    def __init__(self, channels: int, groups: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn_act(channels, channels, 1), conv_bn_act(channels, channels, 3, groups=groups),
                                  nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels))
        self.se = SqueezeExcite(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.se(self.body(x)))


class ResNeXtSE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn_act(3, 64, 3, 2)
        self.blocks = nn.Sequential(*[ResNeXtBlock(64) for _ in range(3)])
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def _images(training: bool) -> dict:
    return {"x": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))}


def _add(name: str, make: Callable[[], nn.Module], tol: float = 1e-3) -> None:
    def build() -> nn.Module:
        torch.manual_seed(0)
        model = make()
        for m in model.modules():  # dropout off, as the corpus's configs: values comparable in training
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        return model

    CNN_MODELS[name] = RealModel(name, build, _images, tol)


CNN_MODELS: dict[str, RealModel] = {}
_add("mobilenet_v2", MobileNetV2)
_add("shufflenet_v2", ShuffleNetV2)
_add("densenet", DenseNet)
_add("squeezenet", SqueezeNet)
_add("resnext_se", ResNeXtSE)
