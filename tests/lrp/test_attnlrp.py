"""method="attnlrp": AttnLRP through the capture's TorchFunctionMode, checked against LXT 2.1 on the same weights.

The LXT side runs in its own environment (LXT 2.1 imports only under transformers 4.x), built by the
``lxt_env`` fixture below with ``pip install --target`` (slow, needs the package index; set
``LXT_ENV=/path`` to reuse a built one) and driven through ``tests/helpers/lxt_reference.py``. Where that environment
cannot be built the agreement tests skip, and under ``CI=true`` fail (``tests/helpers/ci.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lightning_gae as lg
from lightning_gae.methods import explain_methods
from lightning_gae.lrp import UnsupportedOperation
from tests.helpers.ci import environment_missing

transformers = pytest.importorskip("transformers")

LXT_REFERENCE = Path(__file__).resolve().parents[1] / "helpers" / "lxt_reference.py"
TOL = 1e-3
BERT = dict(vocab_size=120, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=32, type_vocab_size=2, num_labels=3, initializer_range=0.1)
LLAMA = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, max_position_embeddings=64, initializer_range=0.1, tie_word_embeddings=False)
GPT2 = dict(vocab_size=120, n_embd=64, n_layer=2, n_head=4, n_positions=64, initializer_range=0.1,
            bos_token_id=0, eos_token_id=0)
QWEN2 = dict(LLAMA, num_key_value_heads=1)
VIT = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128, image_size=12, patch_size=3,
           num_channels=2, num_labels=4, initializer_range=0.1)
CONFIGS = {"bert": BERT, "llama": LLAMA, "gpt2": GPT2, "qwen2": QWEN2, "vit": VIT}
# LXT's environment: transformers 4.x (LXT 2.1 patches its modeling files) beside this project's torch.
LXT_PINS = ["lxt==2.1", "transformers==4.53.3", "huggingface_hub==0.36.2", "tokenizers==0.21.4", "requests==2.34.2",
            "urllib3==2.8.0", "idna==3.20", "charset-normalizer==3.5.2", "certifi==2026.10.19.post1", "fsspec==2026.9.0"]
# LXT imports torchvision.models.vision_transformer (for its ViT patch map) when it is imported; it only reads
# vision_transformer.nn, so a stand-in spares the CUDA-built torchvision.
TORCHVISION_STANDIN = {
    "torchvision/__init__.py": '"""Stand-in for LXT\'s import of torchvision.models.vision_transformer."""\n',
    "torchvision/models/__init__.py": "",
    "torchvision/models/vision_transformer.py": "from torch import nn  # noqa: F401  (LXT reads vision_transformer.nn)\n",
}


def _perturbed(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter moved off its initial value (biases, LayerNorm gains), so no rule hides behind a zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def bert(impl: str, seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    return _perturbed(BertForSequenceClassification(BertConfig(**BERT, attn_implementation=impl)), seed)


def llama(impl: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return _perturbed(LlamaForCausalLM(LlamaConfig(**LLAMA, attn_implementation=impl)), seed)


def gpt2(impl: str, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return _perturbed(GPT2LMHeadModel(GPT2Config(**GPT2, attn_implementation=impl)), seed)


def qwen2(impl: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return _perturbed(Qwen2ForCausalLM(Qwen2Config(**QWEN2, attn_implementation=impl)), seed)


def padded_batch(lengths=(10, 7, 4), vocab=120, token_types=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), n), generator=g)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1
    ids = ids * mask
    inputs = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        inputs["token_type_ids"] = torch.randint(0, 2, (len(lengths), n), generator=g) * mask
    return inputs


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


# --- LXT, the independent oracle -------------------------------------------------------------------


@pytest.fixture(scope="module")
def lxt_env(tmp_path_factory):
    if os.environ.get("LXT_ENV"):
        env = Path(os.environ["LXT_ENV"])
        if not env.is_dir():
            environment_missing(f"LXT_ENV={env} names no directory")
        return env
    return build_lxt_env(tmp_path_factory.mktemp("lxt_env"))


def build_lxt_env(target: Path) -> Path:
    """LXT's environment installed into ``target``; where it cannot be built, the test skips, or fails under CI=true."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *LXT_PINS]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        environment_missing(f"LXT's environment could not be built in 600 s ({' '.join(cmd[3:])})")
    if done.returncode != 0:
        environment_missing(f"LXT's environment could not be built ({' '.join(cmd[3:])}): {done.stderr[-500:]}")
    for rel, text in TORCHVISION_STANDIN.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_text(text)
    return target


@pytest.mark.parametrize("ci", ["true", "TRUE", "", "false"])
def test_an_lxt_environment_that_cannot_be_built_skips_here_and_fails_under_ci(tmp_path, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 1, "", "no index here"))
    outcome = pytest.fail.Exception if ci.lower() == "true" else pytest.skip.Exception
    with pytest.raises(outcome, match="LXT's environment could not be built .*no index here"):
        build_lxt_env(tmp_path)


def lxt_relevance(env: Path, tmp_path: Path, kind: str, model: nn.Module, impl: str, inputs: dict, target, position=None):
    case = {"model": kind, "config": CONFIGS[kind], "implementation": impl,
            "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()}, "inputs": inputs,
            "target": target, "position": position}
    torch.save(case, tmp_path / "case.pt")
    env_vars = {**os.environ, "PYTHONPATH": str(env)}
    done = subprocess.run([sys.executable, str(LXT_REFERENCE), str(tmp_path / "case.pt"), str(tmp_path / "out.pt")],
                          capture_output=True, text=True, env=env_vars, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_bert_equals_lxt_on_the_same_weights(lxt_env, tmp_path, impl):
    model = bert(impl)
    inputs = padded_batch()
    target = torch.tensor([0, 2, 1])
    exp = lg.explain(model, inputs, target=target, method="attnlrp")
    ref = lxt_relevance(lxt_env, tmp_path, "bert", model, impl, inputs, target)
    keep = inputs["attention_mask"].bool()
    assert torch.allclose(exp.score, ref["score"], atol=1e-5)
    err = relative(exp.tokens[keep], ref["relevance"][keep])
    print(f"bert {impl}: max error vs LXT {err:.2e} of the largest |R|; conservation {exp.conservation.tolist()}")
    assert err < TOL
    assert torch.all(exp.tokens[~keep] == 0)
    assert torch.allclose(exp.conservation, exp.tokens.sum(-1) / exp.score)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
def test_causal_lm_last_position_equals_lxt(lxt_env, tmp_path, impl, kind):
    model = {"llama": llama, "gpt2": gpt2, "qwen2": qwen2}[kind](impl)
    inputs = padded_batch(lengths=(9, 6, 9), token_types=False)  # right padding: each row's last real token is read
    target = torch.tensor([5, 17, 40])
    exp = lg.explain(model, inputs, target=target, method="attnlrp", query="last")
    assert exp.query.tolist() == [8, 5, 8]
    ref = lxt_relevance(lxt_env, tmp_path, kind, model, impl, inputs, target, position=exp.query)
    assert torch.allclose(exp.score, ref["score"], atol=1e-5)
    keep = inputs["attention_mask"].bool()
    assert torch.all(exp.tokens[~keep] == 0)
    err = relative(exp.tokens[keep], ref["relevance"][keep])
    print(f"{kind} {impl}: max error vs LXT {err:.2e} of the largest |R|; conservation {exp.conservation.tolist()}")
    assert err < TOL


def hf_vit(impl: str, seed: int = 0):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    return _perturbed(ViTForImageClassification(ViTConfig(**VIT, attn_implementation=impl)), seed)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_vit_patch_relevance_equals_lxt(lxt_env, tmp_path, impl):
    # Pixels in: relevance is read at the patch embedding (get_input_embeddings()), one value per patch;
    # the CLS token, which the model adds after it, gets 0. LXT runs its own generic patches on modeling_vit.
    model = hf_vit(impl)
    pixels = torch.randn(3, 2, 12, 12, generator=torch.Generator().manual_seed(5))
    target = torch.tensor([3, 0, 1])
    exp = lg.explain(model, pixels, target=target, method="attnlrp")
    assert exp.tokens.shape == (3, 1 + 16) and torch.all(exp.tokens[:, 0] == 0)
    ref = lxt_relevance(lxt_env, tmp_path, "vit", model, impl, {"pixel_values": pixels}, target)
    assert torch.allclose(exp.score, ref["score"], atol=1e-5)
    err = relative(exp.tokens[:, 1:], ref["relevance"])
    print(f"vit {impl}: max error vs LXT {err:.2e} of the largest |R|; conservation {exp.conservation.tolist()}")
    assert err < TOL
    # The rules matter here: plain gradient x input at the same leaf is far from both.
    leaves = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, a, out: leaves.append(out.detach().requires_grad_()) or leaves[-1])
    score = model(pixel_values=pixels).logits[torch.arange(3), target]
    hook.remove()
    (grad,) = torch.autograd.grad(score.sum(), leaves)
    assert relative((leaves[0] * grad).sum(-1), ref["relevance"]) > 30 * TOL


# --- without LXT ----------------------------------------------------------------------------------


def test_bert_sdpa_and_eager_agree_and_padding_is_zero():
    inputs = padded_batch()
    sdpa = lg.explain(bert("sdpa"), inputs, target=1, method="attnlrp")
    eager = lg.explain(bert("eager"), inputs, target=1, method="attnlrp")
    assert relative(sdpa.tokens, eager.tokens) < 1e-5
    assert torch.all(sdpa.tokens[inputs["attention_mask"] == 0] == 0)
    assert sdpa.method == "attnlrp" and sdpa.tokens.shape == (3, 10) and sdpa.tokens.dtype == torch.float32
    assert sdpa.layers == [f"bert.encoder.layer.{i}.attention.self" for i in range(3)] == eager.layers
    assert sdpa.conservation.shape == (3,) and torch.isfinite(sdpa.conservation).all()


def test_batch_equals_one_sample_at_a_time():
    model, inputs = bert("sdpa"), padded_batch()
    batched = lg.explain(model, inputs, target=torch.tensor([0, 2, 1]), method="attnlrp")
    for b, length in enumerate((10, 7, 4)):
        one = {k: v[b : b + 1, :length] for k, v in inputs.items()}
        alone = lg.explain(model, one, target=int(batched.target[b]), method="attnlrp")
        assert relative(batched.tokens[b, :length], alone.tokens[0]) < 1e-5
        assert torch.allclose(batched.conservation[b], alone.conservation[0], atol=1e-5)


def test_llama_grouped_query_sdpa_and_eager_agree():
    inputs = padded_batch(lengths=(9, 6), token_types=False)
    sdpa = lg.explain(llama("sdpa"), inputs, target=3, method="attnlrp", query="last")
    eager = lg.explain(llama("eager"), inputs, target=3, method="attnlrp", query="last")
    assert relative(sdpa.tokens, eager.tokens) < 1e-5 and sdpa.layers == eager.layers == [
        "model.layers.0.self_attn", "model.layers.1.self_attn"]


def test_explain_methods_runs_attnlrp_beside_the_attention_methods():
    model, inputs = bert("sdpa"), padded_batch()
    both = explain_methods(model, inputs, ("gae", "attnlrp"), target=0)
    assert list(both) == ["gae", "attnlrp"] and both["gae"].conservation is None
    assert torch.equal(both["attnlrp"].tokens, lg.explain(model, inputs, target=0, method="attnlrp").tokens)
    assert torch.equal(both["gae"].tokens, lg.explain(model, inputs, target=0, method="gae").tokens)


class TinyLM(nn.Module):
    """Bias-free embedding -> LayerNorm -> SwiGLU (activation module) -> GELU -> head over the mean token."""

    def __init__(self, act: nn.Module | None = None, extra=None):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(30, 16)
        self.norm = nn.LayerNorm(16, bias=False)
        self.gate, self.up, self.down = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False), nn.Linear(24, 16, bias=False)
        self.act = act or nn.SiLU()
        self.head = nn.Linear(16, 4, bias=False)
        self.extra = extra

    def get_input_embeddings(self):
        return self.embed

    def forward(self, ids):
        x = self.norm(self.embed(ids))
        x = x + self.down(self.act(self.gate(x)) * self.up(x))
        if self.extra is not None:
            x = self.extra(x)
        return self.head(F.gelu(x).mean(1))


def dense_tiny_reference(model: TinyLM, ids: torch.Tensor, target: int) -> torch.Tensor:
    """The rules written out for TinyLM, by hand: R = e * g with g the modified gradient, one sample."""
    e = model.embed(ids).detach().requires_grad_(True)
    mean = e.mean(-1, keepdim=True)
    x = (e - mean) / (e.var(-1, unbiased=False, keepdim=True) + model.norm.eps).sqrt().detach() * model.norm.weight
    g = model.gate(x)
    a = g * (F.silu(g) / g).detach()                    # identity rule: a = silu(g), gradient silu(g)/g
    prod = a * model.up(x)
    prod = prod.detach() + 0.5 * (prod - prod.detach())  # uniform rule: half the gradient to each side
    h = x + model.down(prod)
    y = h * (F.gelu(h) / h).detach()
    score = model.head(y.mean(1))[:, target].sum()
    (grad,) = torch.autograd.grad(score, [e])
    return (e * grad).sum(-1)


def test_rules_on_a_small_model_equal_the_hand_written_ones_and_conserve():
    model = TinyLM().eval()
    ids = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(3))
    exp = lg.explain(model, ids, target=2, method="attnlrp")
    expected = dense_tiny_reference(model, ids, 2)
    assert relative(exp.tokens, expected) < 1e-5
    # No biases and every rule conservative: the relevance sums to the score.
    assert torch.allclose(exp.conservation, torch.ones(2), atol=1e-4)


class Cube(nn.Module):
    def forward(self, x):
        return x.pow(3)


def test_an_operation_without_a_rule_on_the_path_raises_with_its_module():
    model = TinyLM(extra=Cube()).eval()
    with pytest.raises(UnsupportedOperation, match=r"pow.*'extra', Cube"):
        lg.explain(model, torch.randint(0, 30, (2, 6)), method="attnlrp")
    # Nothing stays patched or hooked after the error.
    assert not torch.overrides._is_torch_function_mode_enabled()
    assert not nn.modules.module._global_forward_hooks and not nn.modules.module._global_forward_pre_hooks
    assert model.embed._forward_hooks == {}


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("fn, name", [
    (torch.exp, "exp"), (lambda x: x.abs(), "abs"), (lambda x: x.clamp(min=0), "clamp"), (lambda x: 1 / x, "div"),
    (lambda x: x / x.norm(dim=-1, keepdim=True), "div"), (lambda x: torch.erf(x) * x, "erf"),
    (lambda x: x.amax(-1, keepdim=True) + x, "amax"),
    (lambda x: F.linear(x, torch.cat([x[0]] * 3)[:16]), "linear"),  # a weight computed from the input: bilinear
])
def test_every_operation_without_a_rule_raises_on_the_path(fn, name):
    with pytest.raises(UnsupportedOperation, match=rf"{name}.*'extra', Lambda"):
        lg.explain(TinyLM(extra=Lambda(fn)).eval(), torch.randint(0, 30, (2, 6)), method="attnlrp")


def test_an_in_place_operation_without_a_rule_raises_at_once():
    with pytest.raises(UnsupportedOperation, match=r"in-place .*relu .*'extra', Lambda"):
        lg.explain(TinyLM(extra=Lambda(lambda x: F.relu(x, inplace=True))).eval(), torch.randint(0, 30, (2, 6)), method="attnlrp")


@pytest.mark.parametrize("inplace", [False, True])
def test_an_in_place_activation_module_is_one_unit_on_its_input(inplace):
    ids = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(3))
    exp = lg.explain(TinyLM(act=nn.SiLU(inplace=inplace)).eval(), ids, target=2, method="attnlrp")
    assert relative(exp.tokens, dense_tiny_reference(TinyLM().eval(), ids, 2)) < 1e-5


class OffPath(nn.Module):
    """An unsupported operation whose result is held constant: never on the explained path."""

    def forward(self, x):
        return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def test_an_operation_without_a_rule_off_the_path_does_not_raise():
    model = TinyLM(extra=OffPath()).eval()
    exp = lg.explain(model, torch.randint(0, 30, (2, 6)), method="attnlrp")
    assert torch.isfinite(exp.tokens).all()


def test_the_model_is_untouched():
    model = bert("sdpa")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    lg.explain(model, padded_batch(), method="attnlrp")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags and all(p.grad is None for p in model.parameters())
    assert not torch.overrides._is_torch_function_mode_enabled()
    assert not nn.modules.module._global_forward_hooks and not nn.modules.module._global_forward_pre_hooks
    assert all(not m._forward_hooks for m in model.modules())


def test_multi_head_attention_through_a_named_embedding_layer():
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tokens = nn.Embedding(30, 16)
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.head = nn.Linear(16, 3)

        def forward(self, ids, src_key_padding_mask=None):
            return self.head(self.layer(self.tokens(ids), src_key_padding_mask=src_key_padding_mask)[:, 0])

    model = Encoder().eval()
    ids = torch.randint(0, 30, (2, 5))
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    exp = lg.explain(model, {"ids": ids, "src_key_padding_mask": pad}, method="attnlrp", embedding_layer="tokens")
    assert exp.layers == ["layer.self_attn"] and torch.all(exp.tokens[1, 3:] == 0)
    alone = lg.explain(model, {"ids": ids[1:, :3]}, target=exp.target[1:], method="attnlrp", embedding_layer=model.tokens)
    assert relative(exp.tokens[1, :3], alone.tokens[0]) < 1e-5


def test_a_model_without_word_embeddings_asks_for_embedding_layer():
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="embedding_layer="):
        lg.explain(model, torch.randn(2, 3, 4), method="attnlrp")


def test_an_embedding_that_never_runs_or_runs_twice_is_named():
    class Twice(TinyLM):
        def forward(self, ids):
            return super().forward(ids) + self.head(self.embed(ids).mean(1))

    with pytest.raises(ValueError, match=r"Embedding\) ran 2 times.*embedding_layer="):
        lg.explain(Twice().eval(), torch.randint(0, 30, (2, 6)), method="attnlrp")
    model = TinyLM().eval()
    model.unused = nn.Embedding(3, 3)
    with pytest.raises(ValueError, match=r"never ran.*embedding_layer="):
        lg.explain(model, torch.randint(0, 30, (2, 6)), method="attnlrp", embedding_layer="unused")
    with pytest.raises(ValueError, match=r"is not a module of TinyLM"):
        lg.explain(model, torch.randint(0, 30, (2, 6)), method="attnlrp", embedding_layer=nn.Embedding(3, 3))


# --- every face takes it: attribute/compare, the Captum class, the callback --------------------------------


def test_compare_and_the_captum_class_give_explains_attnlrp():
    from lightning_gae.attribution import AttnLRP
    from lightning_gae.compare import attribute, compare
    from lightning_gae.options import FaithfulnessOptions

    model = bert("sdpa")
    inputs = padded_batch(token_types=False)
    exp = lg.explain(model, inputs, method="attnlrp")
    assert torch.equal(attribute("attnlrp", model, inputs, exp.target), exp.tokens)
    captum = AttnLRP(lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits, model=model)
    by_captum = captum.attribute(inputs["input_ids"], target=exp.target, additional_forward_args=(inputs["attention_mask"],))
    assert relative(by_captum, exp.tokens) < 1e-6
    modality = lg.TextTokens(vocab=[str(i) for i in range(120)], pad_id=0)
    result = compare(model, inputs, methods=("attnlrp", "random"), modality=modality, batch_size=2,
                     faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc", "abpc")))
    assert set(result.methods) == {"attnlrp", "random"}
    assert all(torch.isfinite(torch.tensor(v)) for v in result.methods["attnlrp"].values())


# --- float inputs: pixels through a patch embedding, features as they are -----------------------------


def _recipe_vit(seed: int = 0):
    from recipes.vit import ViT

    torch.manual_seed(seed)
    return _perturbed(ViT(image_size=8, patch_size=2, in_chans=1, num_classes=5, dim=32, depth=2, heads=2, dropout=0.0), seed)


def test_a_convolution_patch_grid_gives_one_value_per_patch_row_major():
    model = _recipe_vit()
    with torch.no_grad():
        model.patch_embed.bias.zero_()
    pixels = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    pixels[2, :, 2:4, 4:6] = 0  # patch (row 1, col 2) of sample 2: its embedding is exactly 0
    exp = lg.explain(model, pixels, method="attnlrp")
    assert exp.tokens.shape == (4, 1 + 16) and torch.all(exp.tokens[:, 0] == 0)  # CLS: added after the embedding
    assert exp.tokens[2, 1 + 1 * 4 + 2] == 0 and torch.all(exp.tokens[2, 1:].abs().topk(15).values > 0)
    alone = torch.cat([lg.explain(model, pixels[i : i + 1], target=exp.target[i : i + 1], method="attnlrp").tokens for i in range(4)])
    assert relative(exp.tokens, alone) < 1e-5
    # The same leaf named explicitly.
    named = lg.explain(model, pixels, method="attnlrp", embedding_layer="patch_embed")
    assert torch.equal(named.tokens, exp.tokens)


def test_hf_vit_sdpa_and_eager_agree_on_pixels():
    pixels = torch.randn(2, 2, 12, 12, generator=torch.Generator().manual_seed(2))
    a = lg.explain(hf_vit("sdpa"), pixels, method="attnlrp")
    b = lg.explain(hf_vit("eager"), pixels, method="attnlrp")
    assert a.tokens.shape == (2, 17) and relative(a.tokens, b.tokens) < 1e-5


def test_float_features_are_read_at_the_input():
    from recipes.tabular import FTTransformer

    torch.manual_seed(0)
    model = _perturbed(FTTransformer(num_features=5, num_classes=2, dim=16, depth=2, heads=2, dropout=0.0), 0)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(4))
    x[1, 3] = 0.0  # a zero feature carries no relevance (x * grad)
    exp = lg.explain(model, x, target=1, method="attnlrp")
    assert exp.tokens.shape == (3, 6) and torch.all(exp.tokens[:, 0] == 0) and exp.tokens[1, 4] == 0
    # Dense form of the relevance at the input: x * (modified gradient); with the LRP mode off it is
    # not the plain gradient, so recompute the gradient under the mode and compare the product.
    from lightning_gae.lrp.attnlrp import relevance_forward

    leaf = x.clone()
    run = relevance_forward(model, (leaf,), {})
    (grad,) = torch.autograd.grad(run.output[:, 1].sum(), [leaf])
    assert relative(exp.tokens[:, 1:], leaf.detach() * grad) < 1e-6
    alone = torch.cat([lg.explain(model, x[i : i + 1], target=1, method="attnlrp").tokens for i in range(3)])
    assert relative(exp.tokens, alone) < 1e-5


def test_pixels_without_a_patch_embedding_ask_for_embedding_layer():
    class Stem(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(1, 8, 2, stride=2)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            t = self.stem(x).flatten(2).transpose(1, 2)
            return self.head(self.attn(t, t, t)[0].mean(1))

    model = Stem().eval()
    with pytest.raises(ValueError, match="no get_input_embeddings\\(\\) and no 'patch_embed'.*embedding_layer="):
        lg.explain(model, torch.randn(2, 1, 4, 4), method="attnlrp")
    exp = lg.explain(model, torch.randn(2, 1, 4, 4), method="attnlrp", embedding_layer="stem")
    assert exp.tokens.shape == (2, 4)


def test_explaining_again_does_not_show_a_warning_twice():
    # torch.overrides.resolve_name resets Python's warning filters on each call; the LRP mode asks it once per function.
    import warnings

    model = _recipe_vit()
    pixels = torch.randn(2, 1, 8, 8)
    lg.explain(model, pixels, method="attnlrp")
    lg.explain(model, pixels, method="transformer_attribution")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            warnings.warn("shown once at this place", UserWarning, stacklevel=1)
            lg.explain(model, pixels, method="attnlrp")
            lg.explain(model, pixels, method="transformer_attribution")
    assert sum("shown once" in str(w.message) for w in caught) == 1


def test_token_ids_beside_pixels_are_explained_over_the_text_tokens():
    # The text's first attention reads the 17 image tokens as keys: the word embedding's own 5 tokens are still the explained ones.
    class TwoTowers(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(20, 8)
            self.patch_embed = nn.Conv2d(1, 8, 2, stride=2)
            self.image_attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.text_attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(16, 3)

        def get_input_embeddings(self):
            return self.words

        def forward(self, input_ids, pixel_values):
            img = self.patch_embed(pixel_values).flatten(2).transpose(1, 2)
            img = torch.cat([img.mean(1, keepdim=True), img], dim=1)
            img = self.image_attn(img, img, img)[0]
            txt = self.words(input_ids)
            txt = txt + self.image_attn(txt, img, img)[0]  # text queries over image keys
            txt = self.text_attn(txt, txt, txt)[0]
            return self.head(torch.cat([img[:, 0], txt[:, 0]], dim=-1))

    torch.manual_seed(0)
    model = TwoTowers().eval()
    inputs = {"input_ids": torch.randint(0, 20, (2, 5)), "pixel_values": torch.randn(2, 1, 8, 8)}
    exp = lg.explain(model, inputs, method="attnlrp")
    assert exp.tokens.shape == (2, 5) and exp.tokens.abs().sum() > 0


class SelfAttentionLM(nn.Module):
    """Embedding -> one attention (fused SDPA, or the same written out: softmax -> matmul) -> head on token 0."""

    def __init__(self, fused: bool, mask=None, is_causal=False, kv_heads=2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(30, 16)
        self.q, self.kv = nn.Linear(16, 16), nn.Linear(16, 2 * 4 * kv_heads)
        self.out, self.head = nn.Linear(16, 16), nn.Linear(16, 3)
        self.fused, self.mask, self.is_causal, self.kv_heads = fused, mask, is_causal, kv_heads

    def get_input_embeddings(self):
        return self.embed

    def forward(self, ids):
        x = self.embed(ids)
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 4).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, 4).permute(2, 0, 3, 1, 4).unbind(0)
        gqa = {"enable_gqa": True} if self.kv_heads != 4 else {}
        if self.fused:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.is_causal, **gqa)
        else:
            k, v = (t.repeat_interleave(4 // self.kv_heads, dim=1) for t in (k, v))
            scores = (q * 0.5) @ k.transpose(-2, -1)
            if self.is_causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            if self.mask is not None:
                scores = scores + (self.mask if self.mask.dtype != torch.bool else
                                   torch.zeros(self.mask.shape).masked_fill(~self.mask, float("-inf")))
            dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # SDPA's convention: probability 0 there
            o = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0) @ v
        return self.head(x[:, 0] + self.out(o.transpose(1, 2).reshape(b, n, 16))[:, 0])


@pytest.mark.parametrize("case", ["none", "float mask", "bool mask", "bool mask, a row all masked", "causal", "grouped"])
def test_fused_attention_equals_the_written_out_form(case):
    # Fused SDPA in float32 runs as itself (its own backward is the rule past the q/k/v split); a query with
    # every key masked goes the explicit way (probability 0 there, as written out here, and as this torch's fused kernel does).
    allowed = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(4)) > 0.3
    allowed[..., 0] = True
    if case.endswith("all masked"):
        allowed[1, 0, 3] = False
    mask = {"float mask": torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(5)),
            "bool mask": allowed, "bool mask, a row all masked": allowed}.get(case)
    kwargs = {"mask": mask, "is_causal": case == "causal", "kv_heads": 2 if case == "grouped" else 4}
    ids = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(6))
    fused = lg.explain(SelfAttentionLM(True, **kwargs).eval(), ids, target=1, method="attnlrp")
    written = lg.explain(SelfAttentionLM(False, **kwargs).eval(), ids, target=1, method="attnlrp")
    assert torch.isfinite(fused.tokens).all() and fused.tokens.abs().sum() > 0
    assert relative(fused.tokens, written.tokens) < 1e-5
