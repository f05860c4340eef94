"""Parameter layout: flatten a model's tensors into one float32 vector and back.

A model's parameters (in ``state_dict`` order) are laid end to end in one
vector. The layout remembers names, shapes and offsets so that the vector can be
split again, and it defines the *components* (layers) that layer-wise methods
such as FedMCSA work on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

Grouping = Literal["tensor", "module"]
GROUPINGS: tuple[str, ...] = ("tensor", "module")


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a model's parameter tensors in a flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes):
            raise ValueError("names and shapes must have the same length")
        if len(set(self.names)) != len(self.names):
            raise ValueError("parameter names must be unique")

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ParamLayout:
        """Layout of a name -> array mapping (e.g. a ``state_dict``), in its order."""
        return cls(
            names=tuple(arrays.keys()),
            shapes=tuple(tuple(int(s) for s in a.shape) for a in arrays.values()),
        )

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> ParamLayout:
        """Layout of a module's ``state_dict``."""
        return cls.from_arrays(module.state_dict())

    @property
    def named(self) -> bool:
        """Whether the tensors carry real names (a legacy Flower ``Parameters`` gives only positions)."""
        return not all(name.isdigit() for name in self.names)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Start offset of every tensor, plus the total size at the end."""
        return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.sizes)]))

    @property
    def dim(self) -> int:
        """Length of the flat vector."""
        return self.offsets[-1]

    def tensor_slices(self) -> list[slice]:
        """One slice of the flat vector per parameter tensor."""
        off = self.offsets
        return [slice(off[i], off[i + 1]) for i in range(len(self.names))]

    def components(self, grouping: Grouping = "tensor") -> list[tuple[str, slice]]:
        """Names and column slices of the model's components (layers).

        ``"tensor"``: every parameter tensor is its own component (weight and bias
        of a layer are separate), as in FedMCSA's reference code.
        ``"module"``: tensors whose names share a module prefix (``fc1.weight``,
        ``fc1.bias``) form one component ``fc1``. A module's tensors are
        contiguous in a ``state_dict``, so each component is still one slice.
        """
        if grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
        out: list[tuple[str, slice]] = []
        for name, sl in zip(self.names, self.tensor_slices()):
            key = name if grouping == "tensor" else name.rpartition(".")[0] or name
            if out and out[-1][0] == key:
                out[-1] = (key, slice(out[-1][1].start, sl.stop))
            else:
                out.append((key, sl))
        return out

    def flatten(self, arrays: Iterable[np.ndarray | torch.Tensor]) -> torch.Tensor:
        """Concatenate arrays (in layout order) into one float32 vector."""
        arrays = list(arrays)
        if arrays and all(type(a) is np.ndarray and a.dtype == np.float32 for a in arrays):  # a reply's: NumPy's own concatenation
            if tuple(a.shape for a in arrays) != self.shapes:
                raise ValueError(f"shapes {tuple(a.shape for a in arrays)} do not match the layout {self.shapes}")
            return torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]))
        parts = [torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a) for a in arrays]
        shapes = tuple(tuple(p.shape) for p in parts)
        if shapes != self.shapes:
            raise ValueError(f"shapes {shapes} do not match the layout {self.shapes}")
        return torch.cat([p.reshape(-1).to(torch.float32) for p in parts])

    def unflatten(self, vector: torch.Tensor | np.ndarray) -> dict[str, torch.Tensor]:
        """Split a flat vector into named tensors (views of ``vector``)."""
        vec = torch.as_tensor(vector)
        if vec.ndim != 1 or vec.numel() != self.dim:
            raise ValueError(f"expected a vector of length {self.dim}, got shape {tuple(vec.shape)}")
        return {
            name: vec[sl].view(shape)
            for name, sl, shape in zip(self.names, self.tensor_slices(), self.shapes)
        }

    def to_numpy_list(self, vector: torch.Tensor | np.ndarray) -> list[np.ndarray]:
        """Split a flat vector into float32 numpy arrays (copies), in layout order."""
        return [t.detach().cpu().numpy().astype(np.float32, copy=True) for t in self.unflatten(vector).values()]


def flatten_module(module: torch.nn.Module) -> torch.Tensor:
    """A module's ``state_dict`` as one detached float32 vector."""
    return ParamLayout.from_module(module).flatten(t.detach() for t in module.state_dict().values())


def load_flat_(module: torch.nn.Module, vector: torch.Tensor, layout: ParamLayout | None = None) -> None:
    """Copy a flat vector into a module's parameters and buffers, in place."""
    layout = layout or ParamLayout.from_module(module)
    state = module.state_dict()
    with torch.no_grad():
        for name, tensor in layout.unflatten(vector).items():
            state[name].copy_(tensor)

