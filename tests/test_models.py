import pytest
import torch

from flower_pfl.experiment.models import build_model


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_by_hand():
    assert _count(build_model("mlr", (60,), 10)) == 60 * 10 + 10
    assert _count(build_model("dnn", (60,), 10, hidden=20)) == (60 * 20 + 20) + (20 * 10 + 10)
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
    with pytest.raises(ValueError, match="image input"):
        build_model("cnn", (60,), 10)
