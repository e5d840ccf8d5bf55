"""scikit-learn's 8x8 handwritten digits as a LightningDataModule (the data ships with scikit-learn)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset


class DigitsDataModule(pl.LightningDataModule):
    """Images ``[N, 1, 8, 8]`` float32 in [0, 1] and int64 labels, split stratified into train/val.

    There is no separate test set; ``test_dataloader`` serves the validation split.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, seed: int = 0, num_workers: int = 0,
                 persistent_workers: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers and num_workers > 0
        self.class_names = [str(i) for i in range(10)]
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        digits = load_digits()
        # Pixel values are integers 0..16.
        x = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.as_tensor(digits.target, dtype=torch.int64)
        idx_train, idx_val = train_test_split(
            range(len(y)), test_size=self.val_fraction, stratify=digits.target, random_state=self.seed
        )
        idx_train, idx_val = torch.as_tensor(idx_train), torch.as_tensor(idx_val)
        self.train_set = TensorDataset(x[idx_train], y[idx_train])
        self.val_set = TensorDataset(x[idx_val], y[idx_val])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          persistent_workers=self.persistent_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.persistent_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
