import pytest
import torch

from flower_pfl.engine.model_split import head_module, head_problem
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models import build_model
from flower_pfl.experiment.models.base import ModelSettings
from flower_pfl.experiment.models.pretrained import load_pretrained
from flower_pfl.experiment.models.registry import build_model as build_for
from flower_pfl.experiment.models.registry import model_names


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_by_hand():
    assert _count(build_model("mlr", (60,), 10)) == 60 * 10 + 10
    assert _count(build_model("dnn", (60,), 10, hidden_units=20)) == (60 * 20 + 20) + (20 * 10 + 10)
    # CNN on 1x28x28: conv 1->32 (5x5), conv 32->64 (5x5), 64*4*4 -> 512 -> 10
    assert _count(build_model("cnn", (1, 28, 28), 10)) == (25 * 32 + 32) + (25 * 32 * 64 + 64) + (1024 * 512 + 512) + (512 * 10 + 10)
    # CIFAR CNN on 3x32x32: conv 3->64, conv 64->64, 64*5*5 -> 384 -> 192 -> 10
    assert _count(build_model("cifar-cnn", (3, 32, 32), 10)) == (75 * 64 + 64) + (25 * 64 * 64 + 64) + (1600 * 384 + 384) + (384 * 192 + 192) + (192 * 10 + 10)


@pytest.mark.parametrize("name,shape,classes", [("mlr", (1, 28, 28), 10), ("dnn", (3, 32, 32), 10),
                                                ("cnn", (1, 28, 28), 62), ("cifar-cnn", (3, 32, 32), 10)])
def test_forward_shapes_and_seeded_init(name, shape, classes):
    model = build_model(name, shape, classes, seed=0)
    assert model(torch.zeros(4, *shape)).shape == (4, classes)
    same = build_model(name, shape, classes, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))


def test_cnn_needs_image_input():
    with pytest.raises(ValueError, match="model 'cnn' takes images"):
        build_model("cnn", (60,), 10)


# --- the model families -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,expected", [
    # conv 3->6 (5x5), conv 6->16, 16*5*5 -> 120 -> 84 -> 10
    ("lenet5", (75 * 6 + 6) + (150 * 16 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)),
    # the CIFAR ResNet-18 (3x3 stem) of the literature, 10 classes
    ("resnet18", 11_173_962),
    # VGG-11's convolutions (configuration A), then 512 -> 512 -> 512 -> 10
    ("vgg11", (27 * 64 + 64) + (576 * 128 + 128) + (1152 * 256 + 256) + (2304 * 256 + 256) + (2304 * 512 + 512)
     + 3 * (4608 * 512 + 512) + 2 * (512 * 512 + 512) + (512 * 10 + 10)),
    # torchvision's MobileNetV2 (3,504,872 with ImageNet's 1,000 classes) with a 10-class head
    ("mobilenetv2", 3_504_872 - 1281 * 1000 + 1281 * 10),
])
def test_image_model_parameter_counts_by_hand(name, expected):
    assert _count(build_model(name, (3, 32, 32), 10)) == expected


def test_the_resnets_stem_and_normalization():
    cifar, imagenet = build_model("resnet18", (3, 32, 32), 10), build_model("resnet18", (3, 64, 64), 10)
    assert tuple(cifar.conv1.kernel_size) == (3, 3) and isinstance(cifar.maxpool, torch.nn.Identity)
    assert tuple(imagenet.conv1.kernel_size) == (7, 7) and _count(imagenet) == 11_181_642  # torchvision's resnet18, 10 classes
    assert _count(build_model("resnet18", (3, 32, 32), 10, resnet_stem="imagenet")) == 11_181_642
    group = build_model("resnet18", (3, 32, 32), 10, resnet_norm="group")
    assert not list(group.buffers()) and isinstance(group.bn1, torch.nn.GroupNorm) and group.bn1.num_groups == 2
    deeper = build_model("resnet34", (1, 28, 28), 62)
    assert [len(getattr(deeper, f"layer{i}")) for i in range(1, 5)] == [3, 4, 6, 3] and deeper.conv1.in_channels == 1
    half = build_model("resnet18", (3, 32, 32), 10, settings=ModelSettings(width=0.5))
    assert half.fc.in_features == 256 and half(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name,vocab,expected", [
    # embedding 81x8, LSTM 8->256 and 256->256 (4 gates, two biases each), 256 -> 80
    ("char-lstm", 81, 81 * 8 + (4 * 256 * (8 + 256) + 8 * 256) + (4 * 256 * 512 + 8 * 256) + (256 * 80 + 80)),
    # embedding 1000x64, 64 -> 64, 64 -> 4
    ("fasttext", 1000, 1000 * 64 + (64 * 64 + 64) + (64 * 4 + 4)),
])
def test_sequence_model_parameter_counts_by_hand(name, vocab, expected):
    classes = 80 if name == "char-lstm" else 4
    assert _count(build_model(name, (80,), classes, kind="tokens", vocab_size=vocab)) == expected


def test_har_cnn_counts_and_takes_signal_windows():
    # conv 9->32 (9 steps), conv 32->64, 64*26 -> 1024 -> 512 -> 6: PFLlib's HARCNN, 128 steps
    model = build_model("har-cnn", (9, 128), 6)
    assert _count(model) == (81 * 32 + 32) + (288 * 64 + 64) + (1664 * 1024 + 1024) + (1024 * 512 + 512) + (512 * 6 + 6)
    assert model(torch.zeros(3, 9, 128)).shape == (3, 6)
    with pytest.raises(ValueError, match="takes signal windows"):
        build_model("har-cnn", (3, 32, 32), 6)


def _reference(name):
    from flower_pfl.experiment.tables import reference

    return reference(name)[1]


@pytest.mark.parametrize("name", model_names())
def test_every_model_names_its_head_last_maps_a_batch_to_logits_and_is_seeded(name):
    data = _reference(name)
    model, same = build_for(name, data, seed=0), build_for(name, data, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))
    assert head_problem(model) is None and head_module(model).out_features == data.num_classes
    x = torch.randint(1, data.vocab_size, (3, *data.input_shape)) if data.kind == "tokens" else torch.randn(3, *data.input_shape)
    assert model(x).shape == (3, data.num_classes)


@pytest.mark.parametrize("name", ["fasttext", "lstm", "transformer"])
def test_text_models_ignore_the_padding_at_the_end(name):
    data = DataInfo((10,), 4, "tokens", vocab_size=50, padding_id=0)
    model = build_for(name, data, {"text-embed-dim": 8, "text-heads": 2}, seed=0).eval()
    short = torch.randint(1, 50, (5, 6))
    padded = torch.cat([short, torch.zeros(5, 4, dtype=torch.int64)], 1)
    with torch.no_grad():
        assert torch.allclose(model(short), model(padded), atol=1e-5)
        assert not torch.allclose(model(padded), model(torch.randint(1, 50, (5, 10))), atol=1e-3)


def test_models_refuse_samples_they_cannot_take():
    with pytest.raises(ValueError, match="at least 32x32"):
        build_model("vgg11", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="sequences of at least 5 tokens"):
        build_model("textcnn", (4,), 2, kind="tokens", vocab_size=10)
    with pytest.raises(ValueError, match="text-heads = 3 must divide its width"):
        build_model("transformer", (8,), 2, kind="tokens", vocab_size=10, text_heads=3)
    with pytest.raises(ValueError, match="takes token ids"):
        build_model("lstm", (3, 32, 32), 2)
    with pytest.raises(TypeError, match="keys no model family has"):
        build_model("dnn", (6,), 2, hidden=4)


def test_a_head_that_is_not_last_in_the_state_dict_is_named_as_the_problem():
    class HeadFirst(torch.nn.Module):
        head_name = "fc"

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.body = torch.nn.Linear(3, 4)

        def forward(self, x):
            return self.fc(self.body(x))

    model = HeadFirst()
    assert head_module(model) is model.fc  # the model's head_name wins over its last nn.Linear
    assert "its head 'fc' is not the last module of its state_dict ('body' is)" in head_problem(model)
    model.head_name = "nothing"
    assert "head_name = 'nothing' names no module" in head_problem(model)


# --- pretrained weights -----------------------------------------------------------------------------

def test_pretrained_weights_load_where_names_and_shapes_match(tmp_path):
    trained = build_model("resnet18", (3, 32, 32), 100, seed=1)
    torch.save({"state_dict": trained.state_dict()}, tmp_path / "w.pt")
    model = build_model("resnet18", (3, 32, 32), 10, seed=2)
    left = load_pretrained(model, tmp_path / "w.pt")
    assert left == ["fc.weight", "fc.bias"]  # sized for 100 classes in the file: the head keeps its start
    assert torch.equal(model.layer4[1].conv2.weight, trained.layer4[1].conv2.weight)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(tmp_path / "w.safetensors"))
    imagenet = build_model("resnet18", (3, 32, 32), 10, resnet_stem="imagenet")
    with pytest.warns(UserWarning, match="1 tensors outside the head keep their initialization.*conv1.weight"):
        load_pretrained(imagenet, tmp_path / "w.safetensors")  # the 7x7 stem cannot take the 3x3 one
    with pytest.raises(ValueError, match="none of its .* tensors matches"):
        load_pretrained(build_model("lstm", (8,), 2, kind="tokens", vocab_size=10), tmp_path / "w.pt")
    with pytest.raises(ValueError, match="no such file"):
        load_pretrained(model, tmp_path / "missing.pt")
