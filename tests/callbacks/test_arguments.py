"""GAECallback's own arguments, checked when it is built: a wrong type or value is refused naming the argument and
what it accepts, nothing is converted silently, and a name that belongs to another argument is pointed there."""

import re

import numpy as np
import pytest

import lightning_gae as lg
from lightning_gae.callbacks import BatchOptions, DisplayOptions, FaithfulnessOptions, GAECallback, RegionOptions
from lightning_gae.modalities.regions import Region

# (arguments, the argument named, what the refusal says is accepted)
WRONG = [
    ({"num_samples": -1}, "num_samples", r"use an integer, 0 or more \(0 only with batches=BatchOptions"),
    ({"num_samples": 1.5}, "num_samples", r"use an integer, 0 or more"),
    ({"num_samples": "8"}, "num_samples", r"use an integer, 0 or more"),
    ({"num_samples": True}, "num_samples", r"use an integer, 0 or more"),
    ({"num_samples": 0}, "num_samples", r"track at least one sample"),
    ({"every_n_epochs": 0}, "every_n_epochs", r"use a positive integer, or None \(never by epoch\)"),
    ({"every_n_epochs": 1.5}, "every_n_epochs", r"use a positive integer, or None"),
    ({"every_n_epochs": "1"}, "every_n_epochs", r"use a positive integer, or None"),
    ({"every_n_epochs": True}, "every_n_epochs", r"use a positive integer, or None"),
    ({"every_n_train_steps": 0}, "every_n_train_steps", r"use a positive integer, or None \(never by step\)"),
    ({"every_n_train_steps": "10"}, "every_n_train_steps", r"use a positive integer, or None"),
    ({"methods": "gae"}, "methods", r"give a list of methods, e\.g\. \['gae'\]"),
    ({"methods": []}, "methods", r"name at least one; choose from \['gae', 'rollout'"),
    ({"methods": ["gae", "gae"]}, "methods", r"\['gae'\] are given more than once"),
    ({"methods": ["lrp"]}, "methods", r"\['lrp'\] are not methods; choose from \['gae'"),
    ({"methods": ["gae", "saliency"]}, "methods",
     r"\['saliency'\] are Captum methods: pass captum_baselines=\['saliency'\] to draw and score them"),
    ({"methods": ["random"]}, "methods", r"floor .*faithfulness=FaithfulnessOptions\(random_baseline=True\)"),
    ({"modality": lg.ImageTokens}, "modality", r"give an ImageTokens, TextTokens or TabularTokens, a mapping"),
    ({"modality": "image"}, "modality", r"give an ImageTokens, TextTokens or TabularTokens"),
    ({"modality": {"image": "ImageTokens"}}, "modality", r"\{'image': 'str'\} are not modalities of token sets"),
    ({"target": "first"}, "target", r"use 'pred' \(predicted class\), 'label', or a callable"),
    ({"target": 0}, "target", r"use 'pred'"),
    ({"query": "first"}, "query", r"use a token index .*'last' .* or 'mean'"),
    ({"query": 1.5}, "query", r"use a token index"),
    ({"query": True}, "query", r"use a token index"),
    ({"query": [0, 1]}, "query", r"use a token index"),
    ({"captum_baselines": "saliency"}, "captum_baselines", r"give a list of Captum methods, e\.g\. \['saliency'\]"),
    ({"captum_baselines": ["lime"]}, "captum_baselines", r"\['lime'\] are not Captum methods; choose from \['saliency'"),
    ({"captum_baselines": ["gae"]}, "captum_baselines", r"are not Captum methods; choose from"),
    ({"captum_baselines": ["saliency", "saliency"]}, "captum_baselines", r"more than once"),
    ({"print_summary": "no"}, "print_summary", r"use True or False"),
    ({"log_sanity_check": 1}, "log_sanity_check", r"use True or False"),
    ({"faithfulness": {"samples": 4}}, "faithfulness", r"give a FaithfulnessOptions\(\.\.\.\)"),
    ({"batches": [0, 5]}, "batches", r"give a BatchOptions\(\.\.\.\)"),
    ({"engine": "sdpa"}, "engine", r"give an EngineOptions\(\.\.\.\)"),
    ({"display": DisplayOptions}, "display", r"give a DisplayOptions\(\.\.\.\)"),
    ({"regions": [Region("w", "suspect", token_ids=[1])]}, "regions", r"give a RegionOptions\(\.\.\.\)"),
]


@pytest.mark.parametrize("arguments,name,accepted", WRONG, ids=[repr(a)[:50] for a, _, _ in WRONG])
def test_a_wrong_argument_is_refused_when_built_naming_it_and_what_it_accepts(arguments, name, accepted):
    # On main, query="first", print_summary="no" and methods=["gae", "gae"] were accepted, and methods=["saliency"]
    # never mentioned captum_baselines.
    with pytest.raises(ValueError) as refused:
        GAECallback(**arguments)
    assert str(refused.value).startswith(f"GAECallback({name}="), str(refused.value)
    assert re.search(accepted, str(refused.value)), str(refused.value)


def test_the_table_covers_every_argument():
    import inspect

    assert {n for _, n, _ in WRONG} == set(inspect.signature(GAECallback).parameters)


def test_arguments_that_decide_together_are_checked_together():
    with pytest.raises(ValueError, match=r"every_n_epochs and every_n_train_steps are both None; set one of them"):
        GAECallback(every_n_epochs=None)
    with pytest.raises(ValueError, match=r"GAECallback\(target=<callable>\).*captum_baselines=\(\)"):
        GAECallback(target=lambda output: output[:, 0], faithfulness=FaithfulnessOptions(metrics=()),
                    captum_baselines=["saliency"])


@pytest.mark.parametrize("arguments,kept", [
    ({"methods": ["gae", "attnlrp"]}, {"methods": ("gae", "attnlrp")}),
    ({"captum_baselines": ["saliency"]}, {"captum_baselines": ("saliency",)}),
    ({"num_samples": np.int64(4)}, {"num_samples": 4}),
    ({"num_samples": 0, "batches": BatchOptions(sample_indices=[3])}, {"num_samples": 0}),
    ({"every_n_epochs": None, "every_n_train_steps": 10}, {"every_n_epochs": None, "every_n_train_steps": 10}),
    ({"query": "last"}, {"query": "last"}),
    ({"query": -1}, {"query": -1}),
    ({"target": "label"}, {"target": "label"}),
    ({"modality": {"image": lg.ImageTokens(patch_size=4)}}, {}),
    ({"regions": RegionOptions(from_data=True), "print_summary": False}, {"print_summary": False}),
], ids=lambda a: repr(a)[:40])
def test_every_accepted_form_is_kept_in_one_form(arguments, kept):
    callback = GAECallback(**arguments)
    assert {k: getattr(callback, k) for k in kept} == kept
    assert all(type(getattr(callback, k)) is type(v) for k, v in kept.items())


def test_arguments_changed_after_the_callback_is_built_are_checked_when_a_stage_is_set_up(tmp_path, make_trainer):
    from tests.helpers.models import small_vit
    from recipes.digits import DigitsDataModule

    callback = GAECallback(num_samples=2)
    callback.methods = ["gae", "saliency"]  # as a script may do before fit
    trainer = make_trainer(tmp_path, [callback])
    with pytest.raises(ValueError, match=r"GAECallback\(methods=\['gae', 'saliency'\]\).*captum_baselines"):
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    assert trainer.global_step == 0
