"""VGG-11 (Simonyan and Zisserman 2015): torchvision's convolutions with the 512-wide classifier of
federated-learning papers."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from flower_pfl.engine.extras import require
from flower_pfl.engine.params import one_of, param
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error

#: the classifier's hidden width (ImageNet's VGG has 4096: a per-client copy would be half a gigabyte)
HIDDEN = 512
#: five 2x2 max poolings: the smallest image side
MIN_SIDE = 32


class VGG(nn.Module):
    """torchvision's configuration "A" of convolutions (``features``), then ``classifier``: two ReLU linear
    layers of ``HIDDEN`` units (each followed by dropout) and the head ``classifier.fc3``."""

    head_name = "classifier.fc3"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: float, batch_norm: bool, dropout: float) -> None:
        super().__init__()
        from torchvision.models.vgg import cfgs, make_layers

        config = [v if v == "M" else scaled(int(v), width) for v in cfgs["A"]]
        self.features = make_layers(config, batch_norm=batch_norm)
        if input_shape[0] != 3:  # torchvision's first convolution takes RGB
            self.features[0] = nn.Conv2d(input_shape[0], int(config[0]), kernel_size=3, padding=1)
        side = (input_shape[1] // MIN_SIDE) * (input_shape[2] // MIN_SIDE)
        hidden = scaled(HIDDEN, width)
        self.classifier = nn.Sequential(OrderedDict([
            ("fc1", nn.Linear(int(config[-2]) * side, hidden)), ("relu1", nn.ReLU(True)), ("drop1", nn.Dropout(dropout)),
            ("fc2", nn.Linear(hidden, hidden)), ("relu2", nn.ReLU(True)), ("drop2", nn.Dropout(dropout)),
            ("fc3", nn.Linear(hidden, num_classes))]))
        for m in self.modules():  # torchvision's initialization
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)  # type: ignore[arg-type]
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


@dataclass
class VGGs(ModelFamily):
    """VGG-11 (Simonyan and Zisserman 2015): torchvision's eight convolutions, then a 512-wide classifier."""

    models = {"vgg11": "VGG-11: torchvision's configuration A of convolutions, two 512-unit layers and the head "
                       "(images of at least 32x32)"}
    takes = ("image",)

    norm: str = param("none", key="vgg-norm", must=one_of("none", "batch"),
                      doc="normalization after each convolution: 'none' (torchvision's vgg11) or 'batch' (vgg11_bn)")

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        require("torchvision", why="VGG-11")
        if len(data.input_shape) != 3 or min(data.input_shape[1:]) < MIN_SIDE:
            raise shape_error(name, data, f"images (channels, height, width) of at least {MIN_SIDE}x{MIN_SIDE}")
        return VGG(data.input_shape, data.num_classes, settings.width, self.norm == "batch", settings.dropout)
