"""The LXT side of tests/test_attnlrp.py: AttnLRP relevance from LXT 2.1 on given weights.

Runs in its own environment (LXT 2.1 imports only under transformers 4.x; the fixture in
tests/test_attnlrp.py builds it with ``pip install --target``), never in this project's::

    PYTHONPATH=<lxt env> python tests/lxt_reference.py case.pt out.pt

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
}


def main(case_path: str, out_path: str) -> None:
    case = torch.load(case_path, weights_only=False)
    from lxt.efficient import monkey_patch

    import importlib

    import transformers

    family, config_name, model_name = MODELS[case["model"]]
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    monkey_patch(modeling)
    config = getattr(transformers, config_name)(**case["config"], attn_implementation=case["implementation"])
    # LXT's BERT patch swaps the module's classes for its own copies: take the class from the patched module.
    model = getattr(modeling, model_name)(config)
    missing, unexpected = model.load_state_dict(case["state_dict"], strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids", "rotary_emb.inv_freq"))]
    if missing or unexpected:
        raise SystemExit(f"weights do not fit LXT's model: missing {missing}, unexpected {unexpected}")
    model.eval()
    assert model.config._attn_implementation == case["implementation"], model.config._attn_implementation
    for p in model.parameters():
        p.requires_grad_(False)
    inputs = dict(case["inputs"])
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
