"""lightning_gae.modalities.tabular: relevance per feature, removal to the training means, features drawn."""

import numpy as np
import pytest
import torch

from lightning_gae.modalities import TabularTokens


def _distinct_colours(picture):
    return len(np.unique(picture.reshape(-1, 3), axis=0))


def test_tabular_drops_the_prefix_and_checks_the_names():
    modality = TabularTokens(["age", "income", "score"])
    tokens = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 0.0, 0.5, 0.0]])
    torch.testing.assert_close(modality.to_input(tokens, torch.zeros(2, 3)), tokens[:, 1:])
    torch.testing.assert_close(TabularTokens(["a", "b", "c", "d"], prefix_tokens=0).to_input(tokens), tokens)
    with pytest.raises(ValueError, match=r"feature_names has 3: \['age', 'income', 'score'\]"):
        modality.to_input(torch.zeros(1, 3), None)


def test_tabular_removal_fills_the_training_means_whatever_the_batch():
    generator = torch.Generator().manual_seed(4)
    train = torch.randn(200, 3, generator=generator) + torch.tensor([1.0, -2.0, 0.5])
    modality = TabularTokens(["a", "b", "c"], prefix_tokens=0).fit(train)
    assert modality.means == pytest.approx(train.double().mean(dim=0).tolist())
    x = torch.randn(5, 3, generator=generator)
    drop = torch.tensor([[True, False, True]]).expand(5, 3)
    whole = modality.remove(x, drop)
    assert torch.equal(whole[:, 1], x[:, 1])
    torch.testing.assert_close(whole[:, [0, 2]], torch.tensor(modality.means, dtype=torch.float32)[[0, 2]].expand(5, 2))
    # One sample alone is removed to the same values as in the batch: the batch's own mean would leave it unchanged.
    for i in range(5):
        assert torch.equal(modality.remove(x[i : i + 1], drop[i : i + 1]), whole[i : i + 1])
    assert not torch.equal(modality.remove(x[:1], drop[:1]), x[:1])
    with pytest.raises(ValueError, match=r"means=\[\.\.\.\].*modality\.fit\(train_features\)"):
        TabularTokens(["a", "b", "c"]).remove(x, drop)
    with pytest.raises(ValueError, match=r"features \[B, 3\]"):
        TabularTokens(["a", "b", "c"]).fit(torch.zeros(4, 2))


def test_tabular_render_draws_bars_that_follow_relevance():
    modality = TabularTokens(["age", "income", "score"])
    x = torch.tensor([30.0, 1e4, 0.5])
    a = modality.render(x, torch.tensor([0.1, 0.5, 0.2]), "row 3")
    b = modality.render(x, torch.tensor([0.5, 0.1, 0.2]), "row 3")
    bare = modality.render(x, None, "row 3")
    assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[-1] == 3 and a.shape == b.shape
    assert _distinct_colours(a) > 10 and not np.array_equal(a, b) and not np.array_equal(a, bare)
    more = TabularTokens([f"f{i}" for i in range(10)]).render(torch.zeros(10), torch.rand(10), "row")
    assert more.shape[0] > a.shape[0]


def test_tabular_features_of_several_values_are_refused_naming_what_to_do():
    # [B, F, D] features used to leak "TypeError: unsupported format string passed to list.__format__" from the picture.
    modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0] * 3)
    features = torch.rand(2, 3, 4)
    for call in (lambda: modality.to_input(torch.rand(2, 3), features), lambda: modality.removable(features),
                 lambda: modality.render(features[0], torch.rand(3), "row 0")):
        with pytest.raises(ValueError, match=r"TabularTokens\(3 feature_names\) draws.* one value per feature"):
            call()
