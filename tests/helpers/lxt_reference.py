"""The LXT side of tests/lrp/test_attnlrp.py: AttnLRP relevance from LXT 2.1 on given weights.

Runs in its own environment (LXT 2.1 imports only under transformers 4.x; the fixture in
tests/lrp/test_attnlrp.py builds it with ``pip install --target``), never in this project's::

    PYTHONPATH=<lxt env> python tests/helpers/lxt_reference.py case.pt out.pt

``case.pt`` holds ``model`` (a key of ``MODELS``), ``config`` (keyword arguments of the config),
``implementation`` ("sdpa" or "eager"), ``state_dict``, ``inputs`` (keyword inputs without the
embeddings), ``target`` ([B] class or token indices) and, for language models, ``position`` ([B] positions
read). ``out.pt`` gets ``relevance`` [B, N] = sum over the hidden dim of (word-embedding output x its
gradient), the score seeded with 1 as in LXT's README, and ``score`` [B].
"""

from __future__ import annotations

import sys

import torch


# kind -> (transformers family, config class, model class)
MODELS = {
    "bert": ("bert", "BertConfig", "BertForSequenceClassification"),
    "llama": ("llama", "LlamaConfig", "LlamaForCausalLM"),
    "gpt2": ("gpt2", "GPT2Config", "GPT2LMHeadModel"),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM"),
    "vit": ("vit", "ViTConfig", "ViTForImageClassification"),
}


def vit_patch_map(modeling):
    """LXT 2.1 ships no AttnLRP map for Hugging Face's ViT; this is the one its README describes for a new
    architecture, from LXT's own generic patches: LayerNorm with the deviation held constant, the activation
    module under the identity rule, dropout off, and its attention wrapper (a quarter of the gradient to q and
    k, half to v) around every attention function the modeling file dispatches to."""
    from functools import partial

    from lxt.efficient.patches import dropout_forward, layer_norm_forward, non_linear_forward, patch_attention, patch_method
    from transformers.activations import GELUActivation

    return {
        torch.nn.LayerNorm: partial(patch_method, layer_norm_forward),
        torch.nn.Dropout: partial(patch_method, dropout_forward),
        GELUActivation: partial(patch_method, non_linear_forward, keep_original=True),
        modeling: patch_attention,
    }


# transformers 5 renamed the ViT's submodules; LXT's transformers 4.53 reads the old names.
VIT_NAMES_4X = [(r"^vit\.layers\.(\d+)\.attention\.([qkv])_proj\.", None), (r"^vit\.layers\.(\d+)\.attention\.o_proj\.", r"vit.encoder.layer.\1.attention.output.dense."),
                (r"^vit\.layers\.(\d+)\.mlp\.fc1\.", r"vit.encoder.layer.\1.intermediate.dense."),
                (r"^vit\.layers\.(\d+)\.mlp\.fc2\.", r"vit.encoder.layer.\1.output.dense."),
                (r"^vit\.layers\.(\d+)\.", r"vit.encoder.layer.\1.")]


def vit_state_dict_4x(state: dict) -> dict:
    import re

    renamed = {}
    for key, value in state.items():
        for pattern, repl in VIT_NAMES_4X:
            match = re.match(pattern, key)
            if match:
                if repl is None:
                    part = {"q": "query", "k": "key", "v": "value"}[match.group(2)]
                    key = re.sub(pattern, rf"vit.encoder.layer.\1.attention.attention.{part}.", key)
                else:
                    key = re.sub(pattern, repl, key)
                break
        renamed[key] = value
    return renamed


def main(case_path: str, out_path: str) -> None:
    case = torch.load(case_path, weights_only=False)
    from lxt.efficient import monkey_patch

    import importlib

    import transformers

    family, config_name, model_name = MODELS[case["model"]]
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    monkey_patch(modeling, patch_map=vit_patch_map(modeling) if case["model"] == "vit" else None)
    config = getattr(transformers, config_name)(**case["config"], attn_implementation=case["implementation"])
    # LXT's BERT patch swaps the module's classes for its own copies: take the class from the patched module.
    model = getattr(modeling, model_name)(config)
    state = vit_state_dict_4x(case["state_dict"]) if case["model"] == "vit" else case["state_dict"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids", "rotary_emb.inv_freq"))]
    if missing or unexpected:
        raise SystemExit(f"weights do not fit LXT's model: missing {missing}, unexpected {unexpected}")
    model.eval()
    assert model.config._attn_implementation == case["implementation"], model.config._attn_implementation
    for p in model.parameters():
        p.requires_grad_(False)
    inputs = dict(case["inputs"])
    if case["model"] == "vit":
        # Relevance at the patch embeddings' output (one vector per patch), the leaf made by a hook.
        leaves = []

        def leaf(module, args, output):
            leaves.append(output.detach().requires_grad_(True))
            return leaves[-1]

        model.get_input_embeddings().register_forward_hook(leaf)
        logits = model(**inputs).logits
        embeds = leaves[0]
        batch = torch.arange(logits.shape[0])
    else:
        ids = inputs.pop("input_ids")
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds, **inputs).logits
        batch = torch.arange(ids.shape[0])
    if logits.dim() == 3:
        logits = logits[batch, case["position"]]
    score = logits[batch, case["target"]]
    score.sum().backward()
    relevance = (embeds * embeds.grad).sum(-1)
    torch.save({"relevance": relevance.detach(), "score": score.detach()}, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
