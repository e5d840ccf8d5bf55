"""Every entry of the troubleshooting page says what the library says: the case its "When" line describes is run for
real, and each `quote` of its "What happens" line is part of what the library said (an error, a warning, a log line,
or for the entries that are no error, the layers or logged tags it names); a quote written "no `x`" is absent from it.
In a quote, ``...`` stands for any text (and the spaces around it)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from torch import nn

import lightning_gae as lg
from lightning_gae import ImageTokens, TextTokens
from lightning_gae.attribution import GenericAttention
from lightning_gae.callbacks import EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.compare import compare
from recipes.digits import DigitsDataModule
from recipes.seq2seq import PAD, CopyTaskDataModule, Seq2SeqCopier
from lightning_gae import AttentionRecorder
from tests.helpers.explain import recorded_rows
from tests.helpers.models import TAB, MeanPooledViT, PrototypeViT, SumModel, TinySeq2Seq, TinyViT
from lightning_gae.callbacks.batch_layout import fit_to_forward
from lightning_gae.engine.forward import attended_keys as attended
from tests.helpers.processes import TENSOR_PARALLEL_SCRIPT

PAGE = Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md"


def _entry(anchor: str) -> str:
    """The entry's text after its heading, up to the next anchor or section."""
    body = PAGE.read_text().split(f"({anchor})=\n", 1)[1].split("\n", 1)[1]
    return re.split(r"^\([\w-]+\)=$|^## ", body, maxsplit=1, flags=re.M)[0]


def _quotes(anchor: str) -> list[tuple[bool, str]]:
    """``(absent, quote)`` for each backquoted span of an entry's "What happens" line."""
    (line,) = re.findall(r"^\*\*What happens:\*\* (.*?)(?=\n\n|\Z)", _entry(anchor), re.M | re.S)
    return [(bool(no), quote) for no, quote in re.findall(r"(\bno )?`([^`]+)`", line)]


def _pattern(quote: str) -> str:
    return ".*?".join(re.escape(part) for part in re.split(r"\s*\.\.\.\s*", quote))


def _said(case) -> str:
    """What running ``case`` says: its error (``Type: message``), its warnings and the package's log lines, and what
    it returns (the text of a case that is no error)."""
    said: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record):
            said.append(f"{record.name}: {record.getMessage()}")

    logger, handler = logging.getLogger("lightning_gae"), Lines(logging.DEBUG)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            said.append(str(case()))
    except Exception as err:  # what the library raises is the point
        said.append(f"{type(err).__name__}: {err}")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    said += [f"{w.category.__name__}: {w.message}" for w in caught]
    return "\n".join(said)


# --- the cases, one per entry -------------------------------------------------------------------------------


def _vit() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyViT().eval(), torch.rand(2, 1, 8, 8)


def _seq2seq(tgt_len: int = 5) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return TinySeq2Seq().eval(), (torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, tgt_len)))


def _windowed():
    from transformers import SwinConfig, SwinForImageClassification

    config = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                        window_size=4, num_labels=3)
    lg.explain(SwinForImageClassification(config).eval(), {"pixel_values": torch.randn(2, 3, 32, 32)})


class _Pruning(nn.Module):
    """Attention over 5 tokens, then over the first 3 (token pruning)."""

    def __init__(self):
        super().__init__()
        self.first = nn.MultiheadAttention(8, 2, batch_first=True)
        self.second = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        x = (x + self.first(x, x, x)[0])[:, :3]
        return (x + self.second(x, x, x)[0])[:, 0, :2]


def _token_set_changes_size():
    lg.explain(_Pruning().eval(), torch.randn(2, 5, 8))


def _kv_cache():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=2, n_head=2, n_positions=16)).eval()
    ids = torch.randint(0, 30, (1, 5))
    with torch.no_grad():
        past = model(ids, use_cache=True).past_key_values
    lg.explain(model, {"input_ids": ids[:, -1:], "past_key_values": past, "use_cache": True}, query="last")


def _same_layout():
    model, (src, _) = _seq2seq()
    GenericAttention(model, query=3).attribute((src, src.flip(1)), target=1)


def _several_sets_metrics(tmp_path):
    said = []
    text = TextTokens(vocab=[str(i) for i in range(31)], pad_id=PAD)
    callback = GAECallback(num_samples=2, modality={"encoder": text, "decoder": text},
                           engine=EngineOptions(set_inputs={"encoder": "src", "decoder": "tgt_in"}))
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[callback], logger=False, accelerator="cpu",
                      limit_val_batches=1, enable_progress_bar=False, enable_model_summary=False)
    data = CopyTaskDataModule(num_train=32, num_val=16, source_length=7, copy_length=6, batch_size=16)
    try:
        trainer.validate(Seq2SeqCopier(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                       dim_feedforward=16), data)
    except ValueError as err:
        said.append(str(err))
    model, inputs = _seq2seq()
    common = {"modality": {"encoder": TextTokens(), "decoder": TextTokens()},
              "engine": EngineOptions(set_inputs={"encoder": 0, "decoder": 1})}
    try:
        compare(model, inputs, methods=("gae",), faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)),
                **common)
    except ValueError as err:
        said.append(str(err))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = compare(model, inputs, methods=("gae", "saliency"), faithfulness=FaithfulnessOptions(metrics=()),
                         **common)
    assert "saliency" not in result.methods and "gae" in result.methods
    said += [str(w.message) for w in caught]
    return "\n".join(said)


def _gae_tab(tmp_path):
    from tests.helpers.events import read_events

    seed_everything(0)
    text = TextTokens(vocab=[str(i) for i in range(31)], pad_id=PAD)
    callback = GAECallback(num_samples=2, methods=("gae",), modality={"encoder": text, "decoder": text},
                           faithfulness=FaithfulnessOptions(metrics=(), random_baseline=False),
                           engine=EngineOptions(set_inputs={"encoder": "src", "decoder": "tgt_in"}))
    from tests.helpers.trainer import make_trainer

    trainer = make_trainer(tmp_path, [callback], name="s2s", max_epochs=1, limit_val_batches=1)
    trainer.validate(Seq2SeqCopier(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16),
                     CopyTaskDataModule(num_train=32, num_val=16, source_length=7, copy_length=6, batch_size=16))
    acc = read_events(trainer.logger.log_dir)
    return "\n".join(tag for kind in acc.Tags().values() if isinstance(kind, list) for tag in kind)


def _deepspeed():
    if importlib.util.find_spec("deepspeed") is None:
        return NO_DEEPSPEED
    from lightning.pytorch.strategies import DeepSpeedStrategy

    trainer = Trainer(accelerator="cpu", strategy=DeepSpeedStrategy(stage=3), logger=False)
    GAECallback().setup(trainer, None, "fit")


# Lightning's DeepSpeedStrategy needs the deepspeed package, which installs where CUDA does.
NO_DEEPSPEED = "deepspeed is not installed"


def _tensor_parallel(tmp_path):
    from tests.helpers.processes import run_script

    run_script(tmp_path, TENSOR_PARALLEL_SCRIPT)
    return json.loads((tmp_path / "rank_0.json").read_text())["stopped"]


def _no_attention_recorded():
    model, x = _vit()
    lg.explain(TinyViT(impl="einsum").eval(), x)


def _not_attention():
    torch.manual_seed(0)
    model, x = PrototypeViT(per_token=False).eval(), torch.rand(2, 1, 8, 8)
    layers = lg.explain(model, x).layers
    with AttentionRecorder(model) as recorder:
        model(x)
    return f"explained {layers}; AttentionRecorder.ignored: {recorder.ignored}"


def _mean_pooling(tmp_path):
    from transformers import BeitConfig, BeitForImageClassification

    config = BeitConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, num_labels=3)
    lg.explain(BeitForImageClassification(config).eval(), {"pixel_values": torch.randn(2, 3, 16, 16)})
    callback = GAECallback(num_samples=2, methods=["gae"], modality=ImageTokens(patch_size=2, prefix_tokens=0),
                           faithfulness=FaithfulnessOptions(metrics=[]))
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[callback], logger=False, accelerator="cpu",
                      limit_val_batches=1, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(MeanPooledViT(dim=16, depth=1, heads=2), DigitsDataModule(batch_size=32))


class _Owner(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


def _torch_compile():
    model, x = _vit()
    compiled = torch.compile(model, backend="eager")
    compiled(x)
    return lg.explain(_Owner(compiled), x).layers


def _device_map():
    # One layer on the CPU, one on "meta" (a second device: shapes only). Each layer's gradient is on its layer's device.
    g = torch.Generator().manual_seed(0)
    layers = [lg.AttentionRecord("a", 0, torch.rand(2, 3, 5, 5, generator=g).softmax(-1), "sdpa"),
              lg.AttentionRecord("b", 1, torch.empty(2, 3, 5, 5, device="meta"), "sdpa")]
    grads = [torch.randn(2, 3, 5, 5, generator=g), torch.empty(2, 3, 5, 5, device="meta")]
    meta = {"device": "meta"}
    row = recorded_rows("rollout", layers, grads, torch.zeros(2, dtype=torch.long, **meta),
                        torch.ones(2, 5, dtype=torch.bool, **meta))
    return f"the row and the keys attended are on {row.device.type} and {attended(layers[::-1]).device.type}"


def _no_embedding():
    lg.explain(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 3, 4), method="attnlrp")


def _lrp_several_sets():
    model, inputs = _seq2seq()
    said = []
    for method in lg.LRP_METHODS:
        try:
            lg.explain(model, inputs, method=method, query=3, embedding_layer="embed")
        except ValueError as err:
            said.append(f"{type(err).__name__}: {err}")
    return "\n".join(said)


def _unsupported_operation():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64)).eval()
    lg.explain(model, {"input_ids": torch.randint(3, 60, (2, 5))}, method="transformer_attribution", query="last")


def _attention_flow():
    said = []
    model, inputs = _seq2seq()
    big = TinyViT(image_size=32, patch=1, depth=3, heads=2, dim=8).eval(), torch.rand(2, 1, 32, 32)
    for call in (lambda: lg.explain(model, inputs, method="attention_flow", query=3),
                 lambda: lg.explain(_vit()[0], _vit()[1], method="attention_flow", query="mean"),
                 lambda: lg.explain(*big, method="attention_flow")):
        try:
            call()
        except ValueError as err:
            said.append(f"{type(err).__name__}: {err}")
    return "\n".join(said)


def _apple_mps():
    # No MPS device here: what can be checked is that every metric state holds float32 (or integer) values.
    from lightning_gae import metrics

    made = [metrics.AOPC(SumModel(), TAB), metrics.DeletionAUC(SumModel(), TAB), metrics.Sufficiency(SumModel(), TAB),
            metrics.AlignmentAccuracy(), metrics.RelevanceSegmentation(), metrics.RationaleAgreement()]
    floats = {str(state.dtype).removeprefix("torch.") for metric in made for state in metric.metric_state.values()
              if state.is_floating_point()}
    return f"the metric states are {', '.join(sorted(floats))}"


def _diverged():
    model, x = _vit()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    lg.explain(model, x)


def _nan_inputs():
    model, x = _vit()
    x[0, 0, 1, 1] = float("nan")
    lg.explain(model, x)


def _empty():
    model, x = _vit()
    lg.explain(model, x[:0])


def _meta():
    with torch.device("meta"):
        model = TinyViT()
    lg.explain(model.eval(), torch.rand(2, 1, 8, 8))


class Classifier(nn.Module):
    def forward(self, x):
        return x


def _batch_layout():
    fit_to_forward(Classifier(), {"image": torch.rand(2, 3), "label": torch.tensor([0, 1])})


CASES = {"windowed-attention": _windowed, "token-set-changes-size": _token_set_changes_size, "kv-cache": _kv_cache,
         "same-layout-token-sets": _same_layout, "several-token-sets-metrics": _several_sets_metrics,
         "several-token-sets-gae-tab": _gae_tab, "unsupported-strategy": (_deepspeed, _tensor_parallel),
         "no-attention-recorded": _no_attention_recorded, "not-attention": _not_attention,
         "mean-pooling": _mean_pooling, "torch-compile": _torch_compile, "device-map": _device_map,
         "no-embedding": _no_embedding, "lrp-several-token-sets": _lrp_several_sets,
         "unsupported-operation": _unsupported_operation, "attention-flow-limits": _attention_flow,
         "apple-mps": _apple_mps,
         "diverged-model": _diverged, "non-finite-inputs": _nan_inputs, "empty-batch": _empty, "meta-device": _meta,
         "batch-layout": _batch_layout}
# The cases that fit a model with a Trainer or start processes.
SLOW = {"several-token-sets-gae-tab", "unsupported-strategy", "mean-pooling"}


def _run(case, tmp_path) -> str:
    return _said(lambda: case(tmp_path) if "tmp_path" in inspect.signature(case).parameters else case())


@pytest.mark.parametrize("anchor", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in CASES])
def test_the_entry_quotes_what_its_case_says(anchor, tmp_path):
    cases = CASES[anchor] if isinstance(CASES[anchor], tuple) else (CASES[anchor],)
    said = "\n".join(_run(case, tmp_path) for case in cases)
    quotes = _quotes(anchor)
    assert quotes, f"the entry {anchor} quotes nothing"
    wrong = [quote for absent, quote in quotes if (re.search(_pattern(quote), said, re.S) is None) != absent]
    if NO_DEEPSPEED in said and wrong and all("DeepSpeed" in quote for quote in wrong):
        pytest.skip(f"{NO_DEEPSPEED}: {wrong} not checked")
    assert wrong == [], (anchor, said)


def test_every_entry_of_the_page_is_tested():
    assert re.findall(r"^\(([\w-]+)\)=$", PAGE.read_text(), re.M) == list(CASES)


def test_the_quote_patterns_read_elisions():
    assert re.search(_pattern("token set ... changes size (5 tokens)"), "token set 'a' changes size (5 tokens)")
    assert not re.search(_pattern("token set ... changes size"), "token set 'a' grows")
    assert re.search(_pattern("a.b"), "a.b") and not re.search(_pattern("a.b"), "axb")
    assert re.search(_pattern("logits ... Pass"), "logits, which ... Pass")
