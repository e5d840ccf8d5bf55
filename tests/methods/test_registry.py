"""The method registry: a method defined here, outside the package, through the public API alone, works in every face
of the package (explain, explain_methods, compare, GAECallback, the CLI's choices, the GAE tab); the package's own
methods keep the names and order the public tuples had; the registry refuses what it cannot take.

The method below is the worked example of docs/guides/add-a-method.md, which shows this code verbatim.
"""

import ast
import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch import seed_everything
from torch import Tensor, nn

import lightning_gae
from lightning_gae.attribution import ATTRIBUTION_METHODS, CAPTUM_METHODS, attribute
from lightning_gae.callbacks import EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.cli import main
from lightning_gae.compare import DEFAULT_METHODS, compare
from lightning_gae.engine import rules
from lightning_gae.methods import (
    Method,
    RecordedForward,
    explain_methods,
    get_method,
    method_names,
    methods_of,
    register_method,
    unregister_method,
)
from recipes.digits import DigitsDataModule
from recipes.seq2seq import CopyTokens, Seq2SeqCopier, make_copy_task
from tests.helpers.models import TinySeq2Seq, small_vit
from tests.helpers.processes import ROOT, get_json, tensorboard_server

GUIDE = ROOT / "docs" / "guides" / "add-a-method.md"
_GUIDE_START = "# --- the guide's method (docs/guides/add-a-method.md shows it verbatim, after its imports) ---"
_GUIDE_END = "# --- end of the guide's method ---"


# --- the guide's method (docs/guides/add-a-method.md shows it verbatim, after its imports) ---
def first_head(run: RecordedForward) -> Tensor:
    """The last attention call's first head, the readout token's row."""
    attention = run.attentions(last_only=True)[-1][:, 0].float()  # [B, N, N]: the first head
    return rules.query_rows(attention, run.query)


FIRST_HEAD = Method(
    name="first_head",
    kind="attention",
    rule=first_head,
    label="First head",
    last_layer_only=True,
    token_sets="one",
    one_set="one head of one sequence's last self-attention",
    instead="Use 'raw_attention', the mean of the heads, on models with several sets",
    all_zero="all zero: the first head attends to none of these tokens",
)
# --- end of the guide's method ---


@pytest.fixture
def first_head_registered():
    """The guide's method registered for one test, and forgotten after it whatever the test did."""
    method = register_method(FIRST_HEAD)
    yield method
    unregister_method(method.name)


class ViT(nn.Module):
    """8 x 8 images in 2 x 2 patches, two encoder layers of two heads, read at token 0."""

    def __init__(self):
        super().__init__()
        self.patch, self.head = nn.Conv2d(1, 16, 2, stride=2), nn.Linear(16, 3)
        layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)

    def forward(self, x):
        return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2))[:, 0])


def _first_head_oracle(model: ViT, images: Tensor) -> Tensor:
    """The last layer's per-head attention as ``nn.MultiheadAttention`` itself returns it, head 0, row 0, own entry 0."""
    calls = []
    attention = model.encoder.layers[-1].self_attn
    handle = attention.register_forward_pre_hook(lambda module, args, kwargs: calls.append((args, kwargs)),
                                                 with_kwargs=True)
    try:
        with torch.enable_grad():  # no fast path: the attention module itself runs
            model(images)
    finally:
        handle.remove()
    args, kwargs = calls[-1]
    kwargs = {**kwargs, "need_weights": True, "average_attn_weights": False}
    with torch.no_grad():
        weights = attention(*args, **kwargs)[1]  # [B, H, N, N]
    row = weights[:, 0, 0].clone()
    row[:, 0] = 0.0
    return row


def test_the_package_registers_its_methods_in_the_order_of_the_public_tuples():
    assert lightning_gae.METHODS == ("gae", "rollout", "raw_attention", "attn_gradcam", "attn_gradcam_vit",
                                     "attention_flow")
    assert lightning_gae.LRP_METHODS == ("attnlrp", "transformer_attribution")
    assert ATTRIBUTION_METHODS == (*lightning_gae.METHODS, *lightning_gae.LRP_METHODS, "random", *CAPTUM_METHODS)
    assert list(CAPTUM_METHODS) == ["saliency", "input_x_gradient", "integrated_gradients", "gradient_shap"]
    assert DEFAULT_METHODS == ("gae", "rollout", "raw_attention", "attn_gradcam", "attn_gradcam_vit", "random",
                               "saliency", "input_x_gradient", "integrated_gradients")
    assert method_names("baseline") == ("random",)
    assert {m.name for m in methods_of() if m.beside_identity} == {"gae", "transformer_attribution"}
    assert [m.name for m in methods_of() if m.token_sets == "one"] == ["attn_gradcam_vit", "attention_flow",
                                                                      "transformer_attribution"]


def test_the_registry_refuses_a_taken_name_a_wrong_kind_and_an_unknown_name():
    with pytest.raises(ValueError, match="'gae' is registered already"):
        register_method(Method(name="gae", kind="attention", rule=first_head))
    with pytest.raises(ValueError, match=r"kind='rules'.*'attention', 'lrp', 'gradient', 'baseline'"):
        Method(name="x", kind="rules", rule=first_head)
    with pytest.raises(ValueError, match="explained_as"):
        Method(name="x", kind="baseline", rule=first_head)
    with pytest.raises(ValueError, match=r"method='first_head'; choose one of \('gae'"):
        get_method("first_head")


def test_a_method_defined_outside_the_package_explains_and_is_forgotten_after(first_head_registered):
    torch.manual_seed(0)
    model, images = ViT().eval(), torch.rand(3, 1, 8, 8)
    exp = lightning_gae.explain(model, images, method="first_head")
    assert exp.method == "first_head" and exp.layers == ["encoder.layers.1.self_attn"]
    torch.testing.assert_close(exp.tokens, _first_head_oracle(model, images), rtol=1e-5, atol=1e-6)
    # It shares the recorded forward with the package's methods, and gives what it gives alone.
    both = explain_methods(model, images, ("gae", "first_head"))
    torch.testing.assert_close(both["first_head"].tokens, exp.tokens)
    torch.testing.assert_close(both["gae"].tokens, lightning_gae.explain(model, images).tokens)
    assert attribute("first_head", model, images).shape == (3, 16)
    unregister_method("first_head")
    with pytest.raises(ValueError, match=r"method='first_head'; choose one of"):
        lightning_gae.explain(model, images, method="first_head")
    register_method(FIRST_HEAD)  # for the fixture to forget


def test_its_facts_refuse_what_it_does_not_define(first_head_registered):
    torch.manual_seed(0)
    model = TinySeq2Seq().eval()
    inputs = (torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 5)))
    with pytest.raises(ValueError, match=r"method='first_head' is defined on one token set \(one head of one "
                                         r"sequence's last self-attention\); this model has the token sets .*"
                                         r"Use 'raw_attention'"):
        lightning_gae.explain(model, inputs, method="first_head", query=3)


def test_compare_leaves_it_out_on_several_token_sets_with_its_reason(first_head_registered):
    torch.manual_seed(0)
    model = Seq2SeqCopier(d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32).eval()
    data = make_copy_task(4, source_length=7, copy_length=6, generator=torch.Generator().manual_seed(1))
    tokens = CopyTokens()
    with pytest.warns(UserWarning, match=r"method='first_head' is defined on one token set .*first_head is left out"):
        result = compare(model, (data["src"], data["tgt_in"]), methods=("rollout", "first_head"),
                         modality={"encoder": tokens, "decoder": tokens}, ground_truth={"alignment": data["alignment"]},
                         faithfulness=FaithfulnessOptions(metrics=()),
                         engine=EngineOptions(set_inputs={"encoder": 0, "decoder": 1}))
    assert list(result.methods) == ["rollout"] and "Use 'raw_attention'" in result.skipped["first_head"]


def test_compare_scores_it_and_the_cli_offers_it(first_head_registered, capsys):
    torch.manual_seed(0)
    result = compare(ViT().eval(), torch.rand(4, 1, 8, 8), methods=("first_head", "random"))
    assert set(result.methods) == {"first_head", "random"}
    assert {"positive_perturbation_auc", "negative_perturbation_auc"} <= set(result.methods["first_head"])
    with pytest.raises(SystemExit) as done:
        main(["compare", "--help"])
    assert done.value.code == 0
    usage = capsys.readouterr().out
    assert re.search(r"--methods \{[^}]*\bfirst_head\b", usage), usage


@pytest.mark.slow
def test_the_callback_logs_it_and_the_gae_tab_lists_it(first_head_registered, tmp_path, make_trainer,
                                                         read_plugin_events):
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae", "first_head"),
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=16))
    trainer = make_trainer(tmp_path, [callback], name="first_head", max_epochs=1, limit_train_batches=2)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    logdir = Path(trainer.logger.log_dir)
    acc = read_plugin_events(logdir)
    tags = acc.Tags()["tensors"]
    assert any(t.startswith("gae_dashboard/relevance/first_head/") for t in tags), tags
    with tensorboard_server(logdir.parent) as base:
        info = get_json(f"{base}/data/plugin/gae/run?run={logdir.name}")
    assert info["methods"] == ["gae", "first_head"]
    assert info["ranges"]["first_head"] > 0
    assert any("first_head" in entry["methods"] for entry in info["summary"]), info["summary"]


def test_the_guide_shows_this_files_method_verbatim():
    source = Path(__file__).read_text()
    method = source.split(f"{_GUIDE_START}\n")[1].split(_GUIDE_END)[0].strip()
    blocks = [b.strip() for b in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)]
    shown = [b for b in blocks if b.endswith(method)]
    assert shown, "docs/guides/add-a-method.md shows another method than this test's"
    # Its imports are this file's: the method needs nothing the test does not import.
    imported = _imported_names(shown[0][: -len(method)])
    assert imported and imported <= _imported_names(source), imported - _imported_names(source)


def _imported_names(code: str) -> set[tuple[str, str]]:
    """``(module, name)`` of every ``from module import name`` of ``code``."""
    return {(node.module, a.name) for node in ast.walk(ast.parse(code)) if isinstance(node, ast.ImportFrom)
            for a in node.names}
