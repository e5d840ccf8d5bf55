"""Writes the documentation's picture from the main job's own TensorBoard logs.

Run after ``lightning-gae fit --config configs/vit_digits.yaml``::

    python -m recipes.readme_figure runs/vit_digits/version_0 recipes/figures/vit_digits_tensorboard.png

The images are read back with TensorBoard's own ``EventAccumulator``, exactly as TensorBoard serves
them: the ``gae_heatmaps/val_<i>`` pictures of the last explanation step (the first four tracked
samples, every method side by side) above the ``gae_evolution/val_<i>`` grid of the first one.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from matplotlib import image as mpimg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def _last_image(acc: EventAccumulator, tag: str) -> np.ndarray:
    event = acc.Images(tag)[-1]
    return (mpimg.imread(io.BytesIO(event.encoded_image_string), format="png")[..., :3] * 255).astype(np.uint8)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path, help="a run's folder, e.g. runs/vit_digits/version_0")
    parser.add_argument("output", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    acc = EventAccumulator(str(args.logdir), size_guidance={"images": 0})
    acc.Reload()
    images = acc.Tags()["images"]
    heatmaps = sorted((t for t in images if t.startswith("gae_heatmaps/")), key=lambda t: int(t.rsplit("_", 1)[1]))
    if not heatmaps:
        raise SystemExit(f"{args.logdir} has no gae_heatmaps images: is it a run of the main job with GAECallback?")
    evolution = f"gae_evolution/{heatmaps[0].split('/', 1)[1]}"
    parts = [_last_image(acc, t) for t in heatmaps[:4]] + ([_last_image(acc, evolution)] if evolution in images else [])
    width = max(p.shape[1] for p in parts)
    canvas = np.full((sum(p.shape[0] for p in parts), width, 3), 255, dtype=np.uint8)
    row = 0
    for part in parts:
        canvas[row : row + part.shape[0], : part.shape[1]] = part
        row += part.shape[0]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    mpimg.imsave(args.output, canvas)
    print(f"wrote {args.output} ({canvas.shape[1]}x{canvas.shape[0]}) from step {acc.Images(heatmaps[0])[-1].step}")


if __name__ == "__main__":
    main()
