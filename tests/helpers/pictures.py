"""Pictures as the display tests read them: uint8 ``[h, w, 3]`` arrays, searched pixel for pixel."""

import numpy as np


def one_colour(colour, h=8, w=8):
    """A picture ``[h, w, 3]`` of one colour."""
    return np.broadcast_to(np.array(colour, dtype=np.uint8), (h, w, 3)).copy()


def colour_box(out, colour):
    """Bounding box (top, left, height, width) of ``colour`` in ``out``, and whether it is filled solid."""
    rows, cols = np.nonzero((out == colour).all(-1))
    top, left = rows.min(), cols.min()
    height, width = np.ptp(rows) + 1, np.ptp(cols) + 1
    return (top, left, height, width), len(rows) == height * width


def find(picture, part):
    """Top-left corners ``(row, column)`` where ``part`` stands in ``picture`` pixel for pixel."""
    found = []
    first = part[0].tobytes()
    for y in range(picture.shape[0] - part.shape[0] + 1):
        row = picture[y].tobytes()
        start = row.find(first)
        while start != -1:
            x = start // 3
            if start % 3 == 0 and np.array_equal(picture[y : y + part.shape[0], x : x + part.shape[1]], part):
                found.append((y, x))
            start = row.find(first, start + 1)
    return found
