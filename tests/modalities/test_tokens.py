"""lightning_gae.modalities.tokens: the Modality interface every modality shares, built from a config, and
keyword and tuple inputs mapped and removed alike by every modality."""

import numpy as np
import pytest
import torch

from lightning_gae import display
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens, render_map


# --- all of them --------------------------------------------------------------------------------


def test_modalities_share_the_abstract_interface():
    with pytest.raises(TypeError):
        Modality()
    for modality in (ImageTokens(2), TextTokens(), TabularTokens(["a"])):
        assert isinstance(modality, Modality)


def test_lightning_cli_can_build_modalities_from_config():
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--modality", type=Modality)
    config = parser.parse_object({"modality": {
        "class_path": "lightning_gae.modalities.ImageTokens",
        "init_args": {"patch_size": 2, "prefix_tokens": 0, "mean": [0.5], "std": [0.5]},
    }})
    modality = parser.instantiate_classes(config).modality
    assert isinstance(modality, ImageTokens) and (modality.patch_size, modality.prefix_tokens, modality.mean) == (2, 0, (0.5,))


# --- keyword and tuple inputs (Hugging Face batches, a forward that takes the batch) ---------------


def _same(a, b):
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize(
    "modality,tensor,wrap,key",
    [
        (ImageTokens(patch_size=4), torch.rand(2, 3, 8, 8), lambda x: {"pixel_values": x}, "pixel_values"),
        (ImageTokens(patch_size=4, removal="patch"), torch.rand(2, 3, 8, 8), lambda x: ({"pixel_values": x},),
         "pixel_values"),
        (TabularTokens(["a", "b", "c"], means=[0.5, 0.5, 0.5]), torch.rand(2, 3), lambda x: {"features": x}, "features"),
        (TextTokens(mask_id=9), torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]]),
         lambda x: ({"input_ids": x, "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])},), "input_ids"),
    ],
    ids=["image mapping", "image batch as one argument", "features mapping", "text batch as one argument"],
)
def test_keyword_and_tuple_inputs_are_mapped_and_removed_like_their_tensor(modality, tensor, wrap, key):
    # A Hugging Face batch {"pixel_values": ...} used to fail every modality call with "'dict' object has no
    # attribute 'shape'"; a module whose forward takes the batch is called with (batch,).
    inputs = wrap(tensor)
    mapping = inputs[0] if isinstance(inputs, tuple) else inputs
    tokens = torch.rand(2, 1 + 4 if isinstance(modality, ImageTokens) else 4)
    direct = mapping if isinstance(modality, TextTokens) else tensor
    assert torch.equal(modality.to_input(tokens, inputs), modality.to_input(tokens, direct))
    assert torch.equal(modality.unit_scores(tokens, inputs), modality.unit_scores(tokens, direct))
    removable = modality.removable(inputs)
    assert torch.equal(removable, modality.removable(direct))
    drop = torch.zeros_like(removable)
    drop[:, :2] = True
    removed = modality.remove(inputs, drop)
    assert type(removed) is type(inputs)
    removed_mapping = removed[0] if isinstance(removed, tuple) else removed
    expected = modality.remove(direct, drop)
    assert set(removed_mapping) == set(mapping)
    assert torch.equal(removed_mapping[key], expected[key] if isinstance(expected, dict) else expected)
    assert not torch.equal(removed_mapping[key], tensor) or isinstance(modality, TextTokens)
    assert all(_same(removed_mapping[k], mapping[k]) for k in mapping if k not in (key, "attention_mask"))
    blurred = modality.blurred(inputs)
    assert type(blurred) is type(inputs)


# --- drawing a method by its sign ---------------------------------------------------------------


def _has(picture, colour):
    return bool((np.abs(picture.astype(int) - np.asarray(colour, dtype=int)).max(-1) <= 1).sum() > 5)


_SAMPLES = {
    "image": (lambda: ImageTokens(2), torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0)),
              torch.linspace(0.1, 1.0, 64).reshape(8, 8)),
    "text": (lambda: TextTokens(vocab=[f"w{i}" for i in range(10)]), torch.arange(1, 9), torch.linspace(0.1, 1.0, 8)),
    "tabular": (lambda: TabularTokens(["a", "b", "c"]), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.1, 0.5, 1.0])),
}


@pytest.mark.parametrize("kind", sorted(_SAMPLES))
def test_every_modality_draws_a_method_by_its_sign_not_by_the_sample(kind):
    make, x, positive = _SAMPLES[kind]
    modality = make()
    top = {cmap: display.colormap_lut(cmap)[255] for cmap in (display.DIVERGING_CMAP, display.SEQUENTIAL_CMAP)}
    # A signed method's map without a negative value stays on the diverging colormap, its maximum the top colour.
    signed = modality.render(x, positive, "", signed=True)
    assert _has(signed, top[display.DIVERGING_CMAP]) and not _has(signed, top[display.SEQUENTIAL_CMAP])
    # A non-negative method's map with a rounding error below 0 stays on the sequential one.
    rounding = positive.clone().reshape(-1)
    rounding[0] = -1e-4
    sequential = modality.render(x, rounding.reshape(positive.shape), "", signed=False)
    assert _has(sequential, top[display.SEQUENTIAL_CMAP]) and not _has(sequential, top[display.DIVERGING_CMAP])
    # Unknown (None): by the map, as render_map draws for a render written without the keyword.
    assert np.array_equal(modality.render(x, positive, ""), modality.render(x, positive, "", signed=False))


def test_render_map_passes_the_sign_to_a_render_that_takes_it_and_leaves_an_older_render_alone():
    class OlderImages(ImageTokens):
        def render(self, x, relevance, title):  # written before render took signed
            return super().render(x, relevance, title)

    make, x, positive = _SAMPLES["image"]
    assert np.array_equal(render_map(make(), x, positive, True), make().render(x, positive, "", signed=True))
    assert np.array_equal(render_map(OlderImages(2), x, positive, True), make().render(x, positive, ""))
