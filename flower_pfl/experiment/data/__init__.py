"""Data sets and their per-client train/test splits: Synthetic(α, β), image data sets from
torchvision's files or the Hugging Face hub's, and the partition schemes."""

from flower_pfl.experiment.data.client_data import ClientData, train_test_split
from flower_pfl.experiment.data.synthetic import generate_synthetic

__all__ = ["ClientData", "generate_synthetic", "train_test_split"]
