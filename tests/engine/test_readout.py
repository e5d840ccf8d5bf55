"""lightning_gae.engine.readout: inputs with NaN or inf are refused (explain() says how many and where) instead of
returning NaN relevance; an empty batch and a target that is no class index are refused with what to pass; a
``(loss, logits)`` tuple output is read at its logits; padding is read from the attention mask whether the model takes
it by keyword or inside the batch it takes whole."""

import re

import pytest
import torch

import lightning_gae as lg
from tests.helpers.models import TinyViT, small_vit


def test_nan_pixels_are_refused_with_their_count_and_input():
    model = TinyViT().eval()
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(lg.explain(model, x).tokens).all()
    x[1, 0, 2, 3] = float("nan")
    x[2, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"NaN or inf values \(2 in inputs\)"):
        lg.explain(model, x)


def test_the_message_names_the_keyword_input():
    model = TinyViT().eval()

    class Keyword(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, pixel_values, scale):
            return self.inner(pixel_values * scale)

    x = torch.rand(2, 1, 8, 8)
    scale = torch.ones(2, 1, 1, 1)
    scale[0] = float("-inf")
    with pytest.raises(ValueError, match=r"1 in inputs\['scale'\]"):
        lg.explain(Keyword(), {"pixel_values": x, "scale": scale})
    # Integer inputs (token ids) are never NaN and are not checked.
    assert torch.isfinite(lg.explain(Keyword(), {"pixel_values": x, "scale": torch.ones(2, 1, 1, 1)}).tokens).all()


@pytest.mark.parametrize("method", ["gae", "rollout", "attnlrp", "transformer_attribution"])
def test_an_empty_batch_is_refused_by_every_method(method):
    # It used to fail inside a reshape (or return [0, N] maps from some methods and raise in others).
    model = TinyViT().eval()
    with pytest.raises(ValueError, match=r"the inputs hold no sample \(a batch of 0.*explain at least one"):
        lg.explain(model, torch.rand(0, 1, 8, 8), method=method)


@pytest.mark.parametrize("target, got", [("cat", "str 'cat'"), (1.5, "float 1.5"), (torch.tensor([0.0, 1.0]), "a torch.float32 tensor"),
                                         ([1, 2.5], "float 2.5"), (True, "bool True")])
def test_a_target_that_is_no_class_index_is_refused(target, got):
    # A float used to be truncated to a class silently (1.5 -> 1), a string to fail inside torch.tensor.
    model = TinyViT().eval()
    with pytest.raises(ValueError, match=rf"target: a class index is an integer .*got {re.escape(got)}"):
        lg.explain(model, torch.rand(2, 1, 8, 8), target=target)
    assert lg.explain(model, torch.rand(2, 1, 8, 8), target=torch.tensor([0, 1])).target.tolist() == [0, 1]


def test_a_loss_and_logits_tuple_is_read_at_its_logits():
    # A Hugging Face model with return_dict=False and labels returns (loss, logits): it raised a bare IndexError.
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        num_labels=3, return_dict=False)
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(1, 50, (2, 7))
    with_labels = lg.explain(model, {"input_ids": ids, "labels": torch.tensor([0, 2])}, target=torch.tensor([1, 2]))
    plain = lg.explain(model, {"input_ids": ids}, target=torch.tensor([1, 2]))
    assert with_labels.logits.shape == (2, 3)
    torch.testing.assert_close(with_labels.tokens, plain.tokens)
    torch.testing.assert_close(with_labels.score, plain.score)


def _diverged_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        attn_implementation="sdpa", num_labels=2)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.bert.encoder.layer[1].attention.self.query.weight[0, 0] = float("nan")
    ids = torch.randint(1, 50, (2, 6))
    return model, {"input_ids": ids, "attention_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2])}


@pytest.mark.parametrize("method", [*lg.METHODS, *lg.LRP_METHODS])
def test_a_diverged_model_is_refused_by_every_method_with_the_samples_and_what_to_check(method):
    # Padded, so that a method testing the (NaN) probabilities for padding cannot answer first with a wrong reason.
    model, inputs = _diverged_bert()
    with pytest.raises(ValueError, match=re.escape("the model's output to explain is NaN or inf for sample(s) [0, 1]")
                       + ".*Check the weights"):
        lg.explain(model, inputs, method=method)


@pytest.mark.parametrize("method", [*lg.METHODS, *lg.LRP_METHODS])
def test_a_model_with_nan_weights_is_called_diverged_by_every_method_without_padding_too(method):
    # Unpadded, the methods that read the probabilities took every (NaN) key for padding and said the query "lands on a
    # padded position"; gae, which reads the score, said the model diverged.
    model = small_vit().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"is NaN or inf for sample\(s\) \[0, 1\], from finite inputs: the model has "
                                         r"diverged.*Check the weights"):
        lg.explain(model, x, method=method)


def test_a_callable_targets_nonfinite_score_is_refused_too():
    model = TinyViT().eval()
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=re.escape("for sample(s) [1]")):
        lg.explain(model, x, target=lambda logits: logits[:, 0] / torch.tensor([1.0, 0.0]))


def test_an_explanation_says_which_samples_have_finite_relevance():
    model = TinyViT().eval()
    x = torch.rand(17, 1, 8, 8, generator=torch.Generator().manual_seed(0))  # as many samples as tokens
    exp = lg.explain(model, x)
    assert exp.finite.shape == (17,) and exp.finite.all()
    exp.tokens[4, 2] = float("inf")
    exp.relevance["tokens"][9, 0] = float("nan")
    assert exp.finite.nonzero().flatten().tolist() == [i for i in range(17) if i not in (4, 9)]


@pytest.mark.parametrize("query", [1.5, [0.0, 1.0], True])
def test_a_query_that_is_no_integer_is_refused(query):
    model = TinyViT().eval()
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="is no token index: give an integer"):
        lg.explain(model, x, query=query)


@pytest.mark.parametrize("method", [*lg.METHODS, "transformer_attribution"])
def test_a_model_or_inputs_on_the_meta_device_are_refused_with_what_to_do(method):
    with torch.device("meta"):
        model = TinyViT()
    with pytest.raises(ValueError, match="the inputs are on the meta device.*load_state_dict"):
        lg.explain(model, torch.rand(2, 1, 8, 8, device="meta"), method=method)
    with pytest.raises(ValueError, match="the model's parameters are on the meta device"):
        lg.explain(model.eval(), torch.rand(2, 1, 8, 8), method=method)


@pytest.mark.parametrize("method", ["gae", "attnlrp", "transformer_attribution"])
def test_padding_is_read_from_the_batch_a_forward_takes_whole(method):
    # query="last" is the last real token of each row; the LRP methods read padding only from keyword inputs and
    # took position T - 1, a padded one, for a forward(batch). B=3, T=7, hidden 32: no two sizes alike.
    transformers = pytest.importorskip("transformers")
    from tests.helpers.hf_modules import tiny_bert

    torch.manual_seed(0)
    bert = tiny_bert(transformers.BertForTokenClassification, num_labels=3).eval()

    class TakesTheBatch(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, batch):
            return self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    ids = torch.randint(5, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:], mask[2, 3:] = 0, 0  # padded under the mask, the ids left as they were
    batch = {"input_ids": ids, "attention_mask": mask}
    by_keyword = lg.explain(bert, batch, method=method, query="last")
    whole = lg.explain(TakesTheBatch(), (batch,), method=method, query="last")
    assert by_keyword.query.tolist() == whole.query.tolist() == [6, 4, 2]
    torch.testing.assert_close(whole.tokens, by_keyword.tokens)
    assert (whole.tokens[mask == 0] == 0).all()
