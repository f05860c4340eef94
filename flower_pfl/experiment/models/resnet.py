"""ResNet-18 and ResNet-34 (He et al. 2016): torchvision's residual blocks and layer construction, with the
CIFAR stem for small images and batch or group normalization."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from flower_pfl.engine.extras import require
from flower_pfl.engine.params import one_of, param
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error

#: blocks per stage
DEPTHS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}
#: channels of the four stages at width 1
WIDTHS = (64, 128, 256, 512)
#: GroupNorm's groups (Hsieh et al. 2020, "The Non-IID Data Quagmire", use two)
GROUPS = 2
#: images up to this side get the CIFAR stem when ``resnet-stem = "auto"``
CIFAR_SIDE = 32


def norm_layer(kind: str) -> Callable[[int], nn.Module]:
    """BatchNorm2d, or GroupNorm with ``GROUPS`` groups."""
    return nn.BatchNorm2d if kind == "batch" else (lambda channels: nn.GroupNorm(GROUPS, channels))


def resnet(depths: tuple[int, ...], input_shape: tuple[int, ...], num_classes: int, width: float = 1.0,
           norm: str = "batch", cifar_stem: bool = True) -> nn.Module:
    """A ResNet of torchvision's ``BasicBlock`` s with stages of ``depths`` blocks. The CIFAR stem is a 3x3
    convolution of stride 1 without max pooling; ImageNet's a 7x7 convolution of stride 2 and a 3x3 max
    pooling of stride 2 (torchvision's). ``width`` scales the channels; the head is ``fc``."""
    require("torchvision", why="the ResNets")
    from torchvision.models.resnet import BasicBlock, ResNet

    class SmallResNet(ResNet):
        head_name = "fc"

        def __init__(self) -> None:
            nn.Module.__init__(self)
            widths = [scaled(w, width, multiple=GROUPS) for w in WIDTHS]
            self._norm_layer, self.dilation, self.groups, self.base_width = norm_layer(norm), 1, 1, 64
            self.inplanes = widths[0]
            self.conv1 = nn.Conv2d(input_shape[0], widths[0], 3 if cifar_stem else 7, 1 if cifar_stem else 2,
                                   1 if cifar_stem else 3, bias=False)
            self.bn1 = self._norm_layer(widths[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.Identity() if cifar_stem else nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(BasicBlock, widths[0], depths[0])
            self.layer2 = self._make_layer(BasicBlock, widths[1], depths[1], stride=2)
            self.layer3 = self._make_layer(BasicBlock, widths[2], depths[2], stride=2)
            self.layer4 = self._make_layer(BasicBlock, widths[3], depths[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[3] * BasicBlock.expansion, num_classes)
            for m in self.modules():  # torchvision's initialization
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

    SmallResNet.__name__ = SmallResNet.__qualname__ = "ResNet"
    return SmallResNet()


@dataclass
class ResNets(ModelFamily):
    """ResNet-18 and ResNet-34 (He et al. 2016), torchvision's blocks and layers, with the CIFAR stem for
    small images and batch or group normalization (`resnet-norm`)."""

    models = {"resnet18": "ResNet-18: four stages of two basic blocks (64 to 512 channels at width 1), average "
                          "pooling, the head `fc`",
              "resnet34": "ResNet-34: stages of 3, 4, 6 and 3 basic blocks"}
    takes = ("image",)

    norm: str = param("batch", key="resnet-norm", must=one_of("batch", "group"),
                      doc="normalization: 'batch' (torchvision's) or 'group' (GroupNorm, 2 groups; Hsieh et al. 2020)")
    stem: str = param("auto", key="resnet-stem", must=one_of("auto", "cifar", "imagenet"),
                      doc="first layers: 'cifar' (3x3 convolution, no pooling), 'imagenet' (torchvision's 7x7 of "
                          "stride 2 and max pooling, as PFLlib and FL-bench); 'auto': cifar up to 32x32 images")

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        if len(data.input_shape) != 3:
            raise shape_error(name, data, "images (channels, height, width)")
        cifar = self.stem == "cifar" or (self.stem == "auto" and max(data.input_shape[1:]) <= CIFAR_SIDE)
        return resnet(DEPTHS[name], data.input_shape, data.num_classes, settings.width, self.norm, cifar)
