"""Known-answer scores of GAE and its attention baselines on the token-set recipes.

* ``seq2seq``: for every decoder position ``j`` that copies a source token, is the argmax of the
  encoder relevance that source position (:class:`lightning_gae.metrics.AlignmentAccuracy`)?
* ``dual_encoder`` and ``coattention``: the share of the image relevance inside the shape's mask
  (patch relevance weighted by the share of each patch the mask covers, i.e. nearest upsampling)
  and of the text relevance on the caption's colour and shape words; beside them the share a
  uniform relevance would get (the mask's area, the content words' share of the real tokens).

Run from the repository root after fitting the three configs::

    python -m recipes.measure_token_sets \\
        --seq2seq runs/seq2seq/version_0/checkpoints/epoch=3-step=1024.ckpt \\
        --dual_encoder runs/dual_encoder/version_0/checkpoints/epoch=7-step=1024.ckpt \\
        --coattention runs/coattention/version_0/checkpoints/epoch=7-step=1024.ckpt --output runs/token_sets.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader

import lightning_gae
from lightning_gae.cli import configured
from lightning_gae.metrics import AlignmentAccuracy
from recipes.dual_encoder import image_text_similarity
from recipes.seq2seq import NO_ALIGNMENT

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
METHODS: tuple[str, ...] = ("gae", "rollout", "raw_attention")
_INPUT_KEYS = ("input_ids", "pixel_values", "attention_mask")


def _load(config: Path, checkpoint: str) -> tuple[Any, Any]:
    model, datamodule, _ = configured(str(config))
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"])
    datamodule.setup("validate")
    return model.eval(), datamodule


def _first(datamodule: Any, count: int) -> dict[str, Tensor]:
    return next(iter(DataLoader(datamodule.val_set, batch_size=count)))


def seq2seq_alignment(checkpoint: str, num_samples: int, methods: Sequence[str]) -> dict[str, float]:
    """Alignment accuracy of the encoder relevance per method, over every copying decoder position."""
    model, datamodule = _load(CONFIGS / "seq2seq.yaml", checkpoint)
    batch = _first(datamodule, num_samples)
    scores = {}
    for method in methods:
        metric = AlignmentAccuracy(ignore_index=NO_ALIGNMENT)
        for j in range(batch["tgt_in"].shape[1]):
            if (batch["alignment"][:, j] == NO_ALIGNMENT).all():
                continue
            exp = lightning_gae.explain(model, (batch["src"], batch["tgt_in"]), query=j, method=method)
            metric.update(exp.relevance["encoder"], batch["alignment"][:, j])
        scores[method] = metric.compute().item()
    with torch.no_grad():
        predicted = model(batch["src"], batch["tgt_in"]).argmax(-1)
    scores["token_accuracy"] = (predicted == batch["labels"]).float().mean().item()
    return scores


def _mask_share(relevance: Tensor, masks: Tensor, prefix_tokens: int) -> Tensor:
    """``[B]`` share of the patch relevance covered by the mask (each patch weighted by its mask fraction)."""
    patches = relevance[:, prefix_tokens:].float().clamp(min=0)
    side = int(round(patches.shape[1] ** 0.5))
    coverage = F.adaptive_avg_pool2d(masks[:, None].float(), side).flatten(1)
    return (patches * coverage).sum(1) / patches.sum(1).clamp(min=1e-12)


def _word_share(relevance: Tensor, rationales: Tensor) -> Tensor:
    text = relevance.float().clamp(min=0)
    return (text * rationales).sum(1) / text.sum(1).clamp(min=1e-12)


def _shares(exp: Any, batch: dict[str, Tensor], prefix_tokens: int) -> dict[str, float]:
    return {
        "image_in_mask": _mask_share(exp.relevance["image"], batch["masks"], prefix_tokens).mean().item(),
        "text_on_content_words": _word_share(exp.relevance["text"], batch["rationales"]).mean().item(),
    }


def _uniform_shares(batch: dict[str, Tensor]) -> dict[str, float]:
    # Uniform relevance over the real tokens; the query token (EOS or BOS) holds none of it.
    real = batch["attention_mask"].sum(1) - 1
    return {
        "image_in_mask": batch["masks"].float().mean().item(),
        "text_on_content_words": (batch["rationales"].sum(1) / real).mean().item(),
    }


def dual_encoder_shares(checkpoint: str, num_samples: int, methods: Sequence[str]) -> dict[str, dict[str, float]]:
    """Image and text relevance shares of the CLIP recipe for its image-text similarity."""
    model, datamodule = _load(CONFIGS / "dual_encoder.yaml", checkpoint)
    batch = _first(datamodule, num_samples)
    inputs = {k: batch[k] for k in _INPUT_KEYS}
    # The HF CLIPModel itself, so that its dual-encoder preset names the sets "text" and "image".
    result = {m: _shares(lightning_gae.explain(model.model, inputs, target=image_text_similarity, method=m), batch, 1)
              for m in methods}
    return result | {"uniform": _uniform_shares(batch)}


def coattention_shares(checkpoint: str, num_samples: int, methods: Sequence[str]) -> dict[str, dict[str, float]]:
    """Image and text relevance shares of the co-attention recipe for the "match" logit, on matching pairs."""
    model, datamodule = _load(CONFIGS / "coattention.yaml", checkpoint)
    batch = _first(datamodule, 4 * num_samples)
    batch = {k: v[batch["labels"] == 1][:num_samples] for k, v in batch.items()}
    inputs = {k: batch[k] for k in _INPUT_KEYS}
    streams = lightning_gae.Streams(
        self_attention={"text": ["model.text_layers.*", "model.cross_layers.*.text_self"],
                        "image": ["model.image_layers.*", "model.cross_layers.*.image_self"]},
        cross_attention={"model.cross_layers.*.text_cross": ("text", "image"),
                         "model.cross_layers.*.image_cross": ("image", "text")},
        query_set="text",
    )
    result = {m: _shares(lightning_gae.explain(model, inputs, target=1, query=0, streams=streams, method=m), batch, 0)
              for m in methods}
    return result | {"uniform": _uniform_shares(batch)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq2seq", help="checkpoint of configs/seq2seq.yaml")
    parser.add_argument("--dual_encoder", help="checkpoint of configs/dual_encoder.yaml")
    parser.add_argument("--coattention", help="checkpoint of configs/coattention.yaml")
    parser.add_argument("--num_samples", type=int, default=256)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(lightning_gae.METHODS))
    parser.add_argument("--output", help="write the scores as JSON here too")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if args.seq2seq:
        results["seq2seq_alignment_accuracy"] = seq2seq_alignment(args.seq2seq, args.num_samples, args.methods)
    if args.dual_encoder:
        results["dual_encoder_shares"] = dual_encoder_shares(args.dual_encoder, args.num_samples, args.methods)
    if args.coattention:
        results["coattention_shares"] = coattention_shares(args.coattention, args.num_samples, args.methods)
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
