"""MobileNetV2 (Sandler et al. 2018), torchvision's."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from flower_pfl.engine.extras import require
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, shape_error


@dataclass
class MobileNets(ModelFamily):
    """MobileNetV2 (Sandler et al. 2018): torchvision's, with its first convolution taking the data's
    channels; `model-width` is its width multiplier."""

    models = {"mobilenetv2": "MobileNetV2: torchvision's inverted residual blocks and 1280-feature head input "
                             "(at width 1), dropout before the head"}
    takes = ("image",)

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        require("torchvision", why="MobileNetV2")
        from torchvision.models import MobileNetV2

        if len(data.input_shape) != 3:
            raise shape_error(name, data, "images (channels, height, width)")
        model = MobileNetV2(num_classes=data.num_classes, width_mult=settings.width, dropout=settings.dropout)
        first = model.features[0][0]
        if data.input_shape[0] != first.in_channels:
            model.features[0][0] = nn.Conv2d(data.input_shape[0], first.out_channels, 3, 2, 1, bias=False)
            nn.init.kaiming_normal_(model.features[0][0].weight, mode="fan_out")
        model.head_name = "classifier.1"
        return model
