"""lightning_gae.tensorboard.summary: what it writes stays of a size TensorBoard and browsers can show."""

import numpy as np

from tests.helpers.private import _MAX_IMAGE_SIDE, _bounded


def test_a_picture_larger_than_the_limit_is_shrunk_keeping_its_aspect():
    tall = np.random.default_rng(0).integers(0, 255, (3 * _MAX_IMAGE_SIDE, 300, 3), dtype=np.uint8)
    small = tall[:100]
    shrunk = _bounded(tall)
    assert shrunk.dtype == np.uint8 and shrunk.shape == (_MAX_IMAGE_SIDE, 100, 3)
    assert _bounded(small) is small
