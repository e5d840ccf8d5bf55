"""noisy_linear_imputation: equal to Quantus 0.6 and to the dense system without noise; its noise; its errors."""

import numpy as np
import pytest
import torch

from lightning_gae.metrics.functional import noisy_linear_imputation
from tests.helpers.metric_oracle import linear_imputation_oracle


def _masks(batch, height, width, seed):
    """Random masks of several densities, a blob touching the border, and a single pixel in a corner."""
    g = torch.Generator().manual_seed(seed)
    masks = [torch.rand(height, width, generator=g) < share for share in (0.05, 0.5, 0.9, 0.98)]
    blob = torch.zeros(height, width, dtype=torch.bool)
    blob[1:, : width - 2] = True
    corner = torch.zeros(height, width, dtype=torch.bool)
    corner[-1, -1] = True
    masks += [blob, corner]
    for m in masks:
        m[height // 2, width // 2] = False  # every image keeps a pixel
    return torch.stack((masks * batch)[:batch])


def test_without_noise_it_is_quantus_noisy_linear_imputation():
    perturb = pytest.importorskip("quantus.functions.perturb_func")
    images = torch.rand(6, 3, 11, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    masks = _masks(6, 11, 9, seed=1)
    ours = noisy_linear_imputation(images, masks, noise=0.0)
    for image, mask, got in zip(images, masks, ours):
        reference = perturb.noisy_linear_imputation(image.numpy(), indices=np.flatnonzero(mask.numpy()), noise=0.0)
        np.testing.assert_allclose(got.numpy(), reference, rtol=0, atol=1e-8)


def test_without_noise_it_solves_the_dense_system_in_float32_too():
    images = torch.rand(6, 2, 7, 10, generator=torch.Generator().manual_seed(2))
    masks = _masks(6, 7, 10, seed=3)
    ours = noisy_linear_imputation(images, masks, noise=0.0)
    assert ours.dtype == torch.float32
    for image, mask, got in zip(images, masks, ours):
        torch.testing.assert_close(got.double(), linear_imputation_oracle(image, mask), rtol=0, atol=1e-6)
    assert torch.equal(ours[~masks[:, None].expand_as(ours)], images[~masks[:, None].expand_as(images)])


def test_the_noise_is_seeded_gaussian_on_the_removed_pixels_only():
    images = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    masks = torch.rand(8, 16, 16, generator=torch.Generator().manual_seed(5)) < 0.5
    clean = noisy_linear_imputation(images, masks, noise=0.0)
    noisy = noisy_linear_imputation(images, masks, noise=0.05, generator=torch.Generator().manual_seed(6))
    again = noisy_linear_imputation(images, masks, noise=0.05, generator=torch.Generator().manual_seed(6))
    assert torch.equal(noisy, again)
    removed = masks[:, None].expand_as(images)
    assert torch.equal(noisy[~removed], images[~removed])
    deviation = (noisy - clean)[removed]
    assert deviation.std().item() == pytest.approx(0.05, rel=0.05) and abs(deviation.mean().item()) < 0.005


def test_bad_input_names_the_argument():
    images = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        noisy_linear_imputation(images, torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        noisy_linear_imputation(images, torch.zeros(2, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="images must be a float tensor"):
        noisy_linear_imputation(images[0], torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="noise must be >= 0"):
        noisy_linear_imputation(images, torch.zeros(2, 4, 4, dtype=torch.bool), noise=-1.0)
    full = torch.zeros(2, 4, 4, dtype=torch.bool)
    full[1] = True
    with pytest.raises(ValueError, match=r"every pixel of image\(s\) \[1\]"):
        noisy_linear_imputation(images, full)
