"""Recipes with several token sets: their generated ground truth and their models (tests/test_cli.py runs their configs)."""

import torch

from recipes.coattention import CoAttentionMatcher
from recipes.dual_encoder import ShapeCLIP, image_text_similarity
from recipes.seq2seq import BOS, EOS, NO_ALIGNMENT, Seq2SeqCopier, make_copy_task
from recipes.shapes import COLOURS, EOS_ID, PAD_ID, SHAPES, VOCAB, decode, make_shapes


def test_copy_task_targets_copy_the_aligned_source_positions_in_reverse():
    num_symbols, k = 20, 6
    data = make_copy_task(64, source_length=16, copy_length=k, num_symbols=num_symbols, num_distractors=8,
                          generator=torch.Generator().manual_seed(0))
    src, tgt_in, labels, alignment = data["src"], data["tgt_in"], data["labels"], data["alignment"]
    assert src.shape == (64, 16) and labels.shape == tgt_in.shape == alignment.shape == (64, k + 1)
    for b in range(64):
        content = [(p, int(t)) for p, t in enumerate(src[b]) if 3 <= t < 3 + num_symbols]
        assert len(content) == k and len({t for _, t in content}) == k  # distinct content symbols
        expected = content[::-1]
        assert alignment[b, :k].tolist() == [p for p, _ in expected]
        assert labels[b, :k].tolist() == [t for _, t in expected]
        assert labels[b, k] == EOS and alignment[b, k] == NO_ALIGNMENT
        assert tgt_in[b].tolist() == [BOS] + labels[b, :k].tolist()
    # The aligned positions vary between samples: an explanation must read the sample to find them.
    assert len({tuple(a) for a in alignment.tolist()}) > 32


def test_shapes_masks_colours_and_captions_are_what_they_say():
    data = make_shapes(96, image_size=32, mismatch_fraction=0.5, generator=torch.Generator().manual_seed(1))
    pixels, masks = data["pixel_values"], data["masks"]
    assert pixels.shape == (96, 3, 32, 32) and 0 <= pixels.min() and pixels.max() <= 1
    saturation = pixels.amax(1) - pixels.amin(1)
    palette = torch.tensor(list(COLOURS.values()))
    for b in range(96):
        mask, coloured = masks[b], saturation[b] > 0.3
        # Colour appears only on the shape; the rest of the shape is its dark outline.
        assert not (coloured & ~mask).any()
        assert (coloured | (pixels[b].amax(0) <= 0.05))[mask].all()
        assert coloured.sum() > 0.3 * mask.sum()
        assert torch.allclose(pixels[b][:, coloured].mean(1), palette[data["colour"][b]], atol=1e-6)
        # Shapes told apart by plain geometry of the mask's bounding-box crop: how much of the box
        # it fills, whether it is the same upside down, and whether the four points 60% of the way from
        # the centre to the corners are inside it (yes for a circle or square, no for a cross).
        crop = mask[mask.any(1)][:, mask.any(0)]
        fill = float(crop.float().mean())
        mirrored = float((crop & crop.flip(0)).sum() / (crop | crop.flip(0)).sum())
        h, w = crop.shape
        diagonal = [bool(crop[int(fy * h), int(fx * w)]) for fy in (0.2, 0.8) for fx in (0.2, 0.8)]
        name = SHAPES[data["shape"][b]]
        assert (fill > 0.95) == (name == "square")
        assert (mirrored < 0.7) == (name == "triangle")
        if name != "triangle":
            assert all(diagonal) if name in ("circle", "square") else not any(diagonal)

        words = decode(data["input_ids"][b])
        assert words[0] == "<bos>" and words[-1] == "<eos>" and words.count("<eos>") == 1
        named = [VOCAB[i] for i, r in zip(data["input_ids"][b].tolist(), data["rationales"][b].tolist()) if r]
        assert len(named) == 2 and named[0] in COLOURS and named[1] in SHAPES
        assert not (set(words) - set(named)) & (set(COLOURS) | set(SHAPES))  # no other content word
        truth = [list(COLOURS)[data["colour"][b]], SHAPES[data["shape"][b]]]
        assert (named == truth) == bool(data["match"][b])
    assert torch.equal(data["attention_mask"], (data["input_ids"] != PAD_ID).long())
    assert 0.3 < data["match"].float().mean() < 0.7


def test_seq2seq_decoder_is_causal():
    model = Seq2SeqCopier(num_encoder_layers=1, num_decoder_layers=1).eval()
    data = make_copy_task(4, generator=torch.Generator().manual_seed(2))
    changed = data["tgt_in"].clone()
    changed[:, 4:] = 3
    with torch.no_grad():
        a, b = model(data["src"], data["tgt_in"]), model(data["src"], changed)
    assert a.shape == (4, 7, 31)
    assert torch.allclose(a[:, :4], b[:, :4]) and not torch.allclose(a[:, 4:], b[:, 4:])


def _shapes(n, mismatch=0.0):
    return make_shapes(n, mismatch_fraction=mismatch, generator=torch.Generator().manual_seed(3))


def test_clip_pools_each_caption_at_its_eos_and_ignores_padding():
    model = ShapeCLIP(num_layers=1).eval()
    assert model.model.config.text_config.eos_token_id == EOS_ID != 2  # 2 selects HF's legacy argmax pooling
    data = _shapes(4)
    padded = data["input_ids"].masked_fill(data["attention_mask"] == 0, VOCAB.index("circle"))
    with torch.no_grad():
        a = image_text_similarity(model(data["input_ids"], data["pixel_values"], data["attention_mask"]))
        b = image_text_similarity(model(padded, data["pixel_values"], data["attention_mask"]))
    assert a.shape == (4,)
    torch.testing.assert_close(a, b)


def test_coattention_ignores_padding_and_reads_both_streams():
    model = CoAttentionMatcher(cross_layers=1).eval()
    data = _shapes(4, mismatch=0.5)
    padded = data["input_ids"].masked_fill(data["attention_mask"] == 0, VOCAB.index("red"))
    with torch.no_grad():
        logits = model(data["input_ids"], data["pixel_values"], data["attention_mask"])
        torch.testing.assert_close(logits, model(padded, data["pixel_values"], data["attention_mask"]))
        assert not torch.allclose(logits, model(data["input_ids"], data["pixel_values"].flip(0), data["attention_mask"]))
    assert logits.shape == (4, 2)
