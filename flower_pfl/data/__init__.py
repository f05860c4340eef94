"""Data sets and their per-client train/test splits."""

from .client_data import ClientData, train_test_split
from .synthetic import generate_synthetic

__all__ = ["ClientData", "generate_synthetic", "train_test_split"]
