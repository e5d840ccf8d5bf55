"""An explanation that has stopped being faithful says so: GAECallback flags a method whose relevance outside the
read-out token vanishes beside the identity (a saturated BERT) or that does not beat random relevance beyond the
standard error, and the rank tables tie the methods that the standard errors do not tell apart."""

import itertools
import json
import math
import re
import warnings

import pytest
import torch
from lightning.pytorch import seed_everything

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from lightning_gae.callbacks.health import Health, health_flags
from lightning_gae.metrics.functional.health import differs_beyond_stderr
from lightning_gae.tensorboard.ranks import rank_labels
from torch.utils.data import DataLoader

from lightning_gae import TextTokens
from recipes.common import TensorDictDataset
from recipes.text_rationales import BertReviewClassifier, ReviewsDataModule, ReviewTokens, make_reviews
from tests.helpers.hf_modules import HFModule, tiny_bert

POSITIVE = "positive_perturbation_auc"  # lower is better
NEGATIVE = "negative_perturbation_auc"  # higher is better


def _scalars(metric: str, values: dict[str, float], errors: dict[str, float]) -> dict[str, float]:
    out = {f"{metric}/{m}": v for m, v in values.items()}
    out.update({f"{metric}/{m}/stderr": e for m, e in errors.items()})
    return out


def _brute_force_labels(values: dict[str, float], errors: dict[str, float], higher: bool) -> dict[str, str]:
    """Every way to cut the best-first order into consecutive groups, kept when each member is tied with its group's
    first and each group's first is told apart from the previous group's first: exactly one cut is; its labels."""
    known = [m for m in values if not math.isnan(values[m])]
    order = sorted(known, key=lambda m: -values[m] if higher else values[m])  # stable: equal values keep their order
    tied = lambda a, b: not differs_beyond_stderr(values[a], errors[a], values[b], errors[b])  # noqa: E731
    found = []
    for cuts in itertools.product([False, True], repeat=max(0, len(order) - 1)):
        groups = [[order[0]]] if order else []
        for method, cut in zip(order[1:], cuts):
            groups.append([method]) if cut else groups[-1].append(method)
        if (all(tied(g[0], m) for g in groups for m in g)
                and all(not tied(a[0], b[0]) for a, b in zip(groups, groups[1:]))):
            found.append(groups)
    assert len(found) == 1
    groups = found[0] + [[m] for m in values if math.isnan(values[m])]
    return {m: f"#{k}" + ("=" if len(g) > 1 else "") for k, g in enumerate(groups, 1) for m in g}


@pytest.mark.parametrize("metric", [POSITIVE, NEGATIVE])
@pytest.mark.parametrize("values,errors,expected_low_is_best", [
    # Far apart: a plain ranking.
    ({"gae": 30.0, "rollout": 40.0, "random": 50.0}, {"gae": 1.0, "rollout": 1.0, "random": 1.0},
     {"gae": "#1", "rollout": "#2", "random": "#3"}),
    # Within the errors of each other: one rank, marked.
    ({"gae": 30.0, "rollout": 31.0, "random": 32.0}, {"gae": 2.0, "rollout": 2.0, "random": 2.0},
     {"gae": "#1=", "rollout": "#1=", "random": "#1="}),
    # A chain: gae ~ rollout, rollout ~ raw, gae told apart from raw; groups anchor at their best method.
    ({"gae": 30.0, "rollout": 32.0, "raw_attention": 34.0}, {"gae": 1.0, "rollout": 1.0, "raw_attention": 1.0},
     {"gae": "#1=", "rollout": "#1=", "raw_attention": "#2"}),
    # The same values (curves that coincide), errors of 0: tied, in the callback's order.
    ({"rollout": 48.44, "gae": 48.44, "random": 66.88}, {"rollout": 0.0, "gae": 0.0, "random": 4.0},
     {"rollout": "#1=", "gae": "#1=", "random": "#2"}),
    # Every value and error the same.
    ({"gae": 5.0, "rollout": 5.0, "attnlrp": 5.0, "random": 5.0}, {m: 1.0 for m in ("gae", "rollout", "attnlrp", "random")},
     {"gae": "#1=", "rollout": "#1=", "attnlrp": "#1=", "random": "#1="}),
    # One sample has no standard error: nothing tells it apart.
    ({"gae": 10.0, "rollout": 90.0}, {"gae": float("nan"), "rollout": 1.0}, {"gae": "#1=", "rollout": "#1="}),
    # A method without a value ranks last, alone.
    ({"gae": float("nan"), "rollout": 20.0, "random": 60.0}, {"gae": 1.0, "rollout": 1.0, "random": 1.0},
     {"rollout": "#1", "random": "#2", "gae": "#3"}),
])
def test_ties_are_marked_as_a_brute_force_over_every_grouping_finds(metric, values, errors, expected_low_is_best):
    labels = rank_labels(_scalars(metric, values, errors))[metric]
    assert labels == _brute_force_labels(values, errors, higher=metric == NEGATIVE)
    if metric == POSITIVE:
        assert labels == expected_low_is_best


def test_ties_match_the_brute_force_on_random_small_tables():
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = 2 + trial % 4
        # Few distinct values, so that equal values and equal errors come up often.
        values = {f"m{i}": float(torch.randint(0, 6, (1,), generator=generator)) for i in range(n)}
        errors = {f"m{i}": float(torch.randint(0, 3, (1,), generator=generator)) * 0.5 for i in range(n)}
        for metric in (POSITIVE, NEGATIVE):
            assert rank_labels(_scalars(metric, values, errors))[metric] == _brute_force_labels(
                values, errors, higher=metric == NEGATIVE)


def test_a_flag_follows_the_metrics_direction_and_names_the_most_faithful_method():
    # Positive perturbation AUC: lower is better. gae is above random's (worse), rollout well below (better).
    scalars = _scalars(POSITIVE, {"gae": 90.0, "rollout": 40.0, "random": 73.0}, {"gae": 0.5, "rollout": 2.0, "random": 2.0})
    flags = health_flags(7, scalars, {})
    assert [(f.method, f.cause) for f in flags] == [("gae", "random")]
    assert "worse than random relevance beyond the standard error" in flags[0].finding
    assert "positive_perturbation_auc 90 ± 0.5 vs random 73 ± 2" in flags[0].faithfulness
    assert "rollout 40 ± 2" in flags[0].best
    # The same numbers on a metric where higher is better: rollout is the one below the floor.
    flags = health_flags(7, _scalars(NEGATIVE, {"gae": 90.0, "rollout": 40.0, "random": 73.0},
                                     {"gae": 0.5, "rollout": 2.0, "random": 2.0}), {})
    assert [(f.method, f.cause) for f in flags] == [("rollout", "random")] and "gae 90 ± 0.5" in flags[0].best
    # Within the errors of random where another method is beyond them: flagged, said so.
    close = _scalars(POSITIVE, {"gae": 70.0, "rollout": 40.0, "random": 73.0}, {"gae": 2.0, "rollout": 2.0, "random": 2.0})
    (flag,) = health_flags(7, close, {})
    assert flag.method == "gae" and "not better than random relevance beyond the standard error" in flag.finding
    assert "where another method is" in flag.finding
    # The main job's step 413 on 32 samples: gae better than random but within its errors, rollout beyond them, and gae
    # not told apart from rollout either: the errors cannot say which of the two to read, so nothing is flagged.
    main_job = _scalars(POSITIVE, {"gae": 34.38, "rollout": 25.47, "random": 42.5}, {"gae": 5.1, "rollout": 3.8, "random": 4.3})
    assert health_flags(7, main_job, {}) == []
    # Every method within the errors of random (too few samples to tell): no flag; no standard error: nothing to tell by.
    few = _scalars(POSITIVE, {"gae": 70.0, "rollout": 69.0, "random": 73.0}, {"gae": 6.0, "rollout": 6.0, "random": 6.0})
    assert health_flags(7, few, {}) == []
    assert health_flags(7, {f"{POSITIVE}/gae": 90.0, f"{POSITIVE}/random": 73.0}, {}) == []


def test_not_better_than_random_is_raised_when_it_holds_at_two_scored_steps_in_a_row():
    # One step's scores on a few dozen samples cross twice the standard error by chance now and then: a single step
    # is not enough, two in a row are.
    from lightning.pytorch import Trainer

    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    below = _scalars(POSITIVE, {"gae": 70.0, "rollout": 40.0, "random": 73.0}, {"gae": 2.0, "rollout": 2.0, "random": 2.0})
    fine = _scalars(POSITIVE, {"gae": 45.0, "rollout": 40.0, "random": 73.0}, {"gae": 2.0, "rollout": 2.0, "random": 2.0})
    health = Health()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for step, scalars in ((10, below), (20, fine), (30, below), (40, below), (50, below)):
            health.check(trainer, step, scalars)
    assert [(f.step, f.method, f.cause) for f in health.flags] == [(40, "gae", "random")]
    assert "(here and at the scored step before)" in health.flags[0].finding
    assert len([w for w in said if "gae's explanation is not faithful" in str(w.message)]) == 1


def test_a_flag_beside_the_identity_names_the_share_of_samples_and_is_raised_once():
    scalars = _scalars(POSITIVE, {"gae": 40.0, "rollout": 41.0, "random": 73.0}, {"gae": 2.0, "rollout": 2.0, "random": 2.0})
    # The small BERT: 15 of 32 scored samples (47%) with GAE's largest relevance beside the identity ~1e-6.
    bert = torch.cat([torch.full((15,), 7.7e-7), torch.linspace(2e-4, 5e-2, 17)])
    flags = health_flags(3, scalars, {"samples of the faithfulness subset": {"gae": bert}})
    assert [(f.method, f.cause) for f in flags] == [("gae", "identity")]
    assert "negligible on 15 of 32 samples of the faithfulness subset (47%)" in flags[0].finding
    assert "7.7e-07" in flags[0].finding
    assert "rollout 41 ± 2" in flags[0].best and "vanish beside the identity" in flags[0].text()
    subset = {"samples of the faithfulness subset": {"gae": bert}}
    assert health_flags(3, scalars, subset, raised={("gae", "identity")}) == []
    # Whatever the schedule: the tracked samples of a step that scores nothing are enough, with no faithfulness at all.
    (flag,) = health_flags(4, {}, {"tracked samples": {"gae": torch.tensor([0.0, 3e-7, 0.2, 0.3])}})
    assert "on 2 of 4 tracked samples (50%)" in flag.finding and "not scored at this step" in flag.faithfulness
    # The larger set is named where both are; a healthy scale (an untrained model's included) and one stray sample in
    # 32 raise nothing.
    (flag,) = health_flags(5, {}, {"tracked samples": {"gae": torch.zeros(4)},
                                       "samples of the faithfulness subset": {"gae": bert}})
    assert "15 of 32 samples of the faithfulness subset" in flag.finding
    assert health_flags(3, scalars, {"tracked samples": {"gae": torch.tensor([8e-5, 0.01, 0.2, 0.3])}}) == []
    assert health_flags(3, scalars, {"tracked samples": {"gae": torch.cat([torch.zeros(1), torch.full((31,), 0.1)])}}) == []


def test_health_checks_the_tracked_samples_at_every_step_and_keeps_its_state_as_plain_data():
    from lightning.pytorch import Trainer

    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    below = _scalars(POSITIVE, {"gae": 70.0, "rollout": 40.0, "random": 73.0}, {"gae": 2.0, "rollout": 2.0, "random": 2.0})
    health = Health()
    health.check(trainer, 10, below)
    # A step that scores nothing neither forgets the scored step before nor hides a degenerate map.
    with pytest.warns(UserWarning, match=r"negligible on 3 of 4 tracked samples \(75%\)"):
        health.check(trainer, 15, {}, {"gae": torch.tensor([[0.0, 1e-7, 0.0], [0.0, 0.0, 0.0], [0.0, 2e-6, 0.0],
                                                             [0.0, 0.3, 0.1]]), "rollout": torch.zeros(4, 3)})
    health.check(trainer, 20, below)
    assert [(f.step, f.method, f.cause) for f in health.flags] == [(15, "gae", "identity"), (20, "gae", "random")]
    state = health.state_dict()
    assert json.loads(json.dumps(state)) == state      # plain data
    restored = Health()
    restored.load_state_dict(state)
    assert restored.flags == health.flags and restored.state_dict() == state


def _reviews(max_length: int = 16):
    """The recipe's reviews with one sentiment word each, so that removing the word a method ranks first flips the
    prediction and the positive perturbation AUC tells a faithful method from random relevance."""

    class OneWordReviews(ReviewsDataModule):
        def setup(self, stage=None):
            if self.train_set is None:
                h = self.hparams
                self.train_set, self.val_set = (TensorDictDataset(make_reviews(
                    n, h.max_length, max_planted=1, generator=torch.Generator().manual_seed(h.seed + k)))
                    for k, n in ((0, h.num_train), (1, h.num_val)))

    return OneWordReviews(num_train=2000, num_val=128, max_length=max_length, batch_size=64, seed=0)


def _fit(tmp_path, make_trainer, name: str, hidden: int, lr: float, epochs: int, every_n_epochs: int):
    seed_everything(0)
    model = BertReviewClassifier(max_length=16, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=2 * hidden, dropout=0.0, lr=lr)
    callback = GAECallback(num_samples=2, every_n_epochs=every_n_epochs, methods=("gae", "rollout"),
                           modality=ReviewTokens(), faithfulness=FaithfulnessOptions(
                               metrics=(POSITIVE,), samples=64, interim_samples=0, every_n_explanations=1))
    trainer = make_trainer(tmp_path, [callback], name=name, max_epochs=epochs, limit_train_batches=None,
                           limit_val_batches=None)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=_reviews())
    said = [str(w.message) for w in records if "explanation is not faithful" in str(w.message)]
    return callback, trainer, said


@pytest.mark.slow
def test_a_saturated_bert_flags_gae_and_names_a_more_faithful_method(tmp_path, make_trainer, read_events,
                                                                     read_plugin_events):
    # Hugging Face BERT from a tiny config, trained hard on one-word reviews: its validation loss falls to ~1e-4 within
    # two epochs, and GAE's relevance beside the identity to ~1e-7..1e-6 (exactly 0 for about half the sentences).
    callback, trainer, said = _fit(tmp_path, make_trainer, "saturated", hidden=32, lr=1e-2, epochs=6, every_n_epochs=3)
    assert float(trainer.callback_metrics["val_loss"]) < 1e-3
    flags = [f for f in callback.run.health.flags if f.cause == "identity"]
    assert [f.method for f in flags] == ["gae"]
    flag = flags[0]
    assert "rollout" in flag.best and "gae" not in flag.best.split(":", 1)[1]
    assert f"{POSITIVE} " in flag.faithfulness and "vs random" in flag.faithfulness
    # Once in the terminal per method and cause, with the step, the numbers, the best method and the cause.
    ours = [m for m in said if "relevance beside the identity is negligible on" in m]
    assert len(ours) == 1 and f"step {flag.step}: gae's" in ours[0] and "rollout" in ours[0]
    assert "vanish beside the identity" in ours[0] and "± " in ours[0]
    # In the summary printed when fit ends.
    assert "flags (explanations that are not faithful" in callback.summary
    assert f"step {flag.step}: gae's explanation is not faithful" in callback.summary
    # In the Text tab, one entry per step, and as a tensor for the GAE tab.
    events = read_events(trainer.logger.log_dir)
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("gae_health/text_summary")}
    assert "gae's explanation is not faithful" in texts[flag.step] and "rollout" in texts[flag.step]
    acc = read_plugin_events(trainer.logger.log_dir)
    tag = "gae_dashboard/flag/gae/identity"
    assert json.loads(acc.SummaryMetadata(tag).plugin_data.content)["kind"] == "flag"
    assert [e.step for e in acc.Tensors(tag)] == [flag.step]


@pytest.mark.slow
def test_a_bert_that_every_method_explains_above_the_floor_raises_no_flag(tmp_path, make_trainer, read_events):
    # The same model, trained gently for one epoch: GAE's relevance beside the identity is ~3e-3, and GAE and rollout
    # both beat random relevance on the positive perturbation AUC beyond the standard errors.
    callback, trainer, said = _fit(tmp_path, make_trainer, "healthy", hidden=64, lr=3e-3, epochs=1, every_n_epochs=1)
    assert said == [] and callback.run.health.flags == []
    assert "flags (" not in callback.summary and f"{POSITIVE}" in callback.summary
    assert "gae_health/text_summary" not in read_events(trainer.logger.log_dir).Tags()["tensors"]


class SpuriousWordBert(HFModule):
    """A Hugging Face BERT from a tiny config, trained briskly (AdamW, 3e-3) on sentences labelled by one word."""

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def _spurious_sentences(n: int, seed: int) -> list[dict]:
    """Random sentences of 12 ids after a CLS id 1; 45% hold the word 7 somewhere, and their label is 1."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (n, 12), generator=generator)
    ids[:, 0] = 1
    ids[ids == 7] = 8
    has = torch.rand(n, generator=generator) < 0.45
    place = torch.randint(1, 12, (n,), generator=generator)
    ids[has, place[has]] = 7
    return [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": y} for i, y in zip(ids, has.long())]


@pytest.mark.slow
def test_a_bert_that_decides_by_one_word_flags_gae_on_the_share_of_samples_whatever_the_schedule(
        tmp_path, make_trainer, read_events):
    # Within its first epoch (~2 s) the model decides by the word alone and saturates on the sentences that hold it:
    # GAE's largest relevance beside the identity is ~1e-7 or exactly 0 there, ~1e-4 on the others. No perturbation
    # metric is scored (FaithfulnessOptions(metrics=())), so only the tracked samples of each step can tell.
    seed_everything(0)
    model = SpuriousWordBert(tiny_bert(vocab_size=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    callback = GAECallback(num_samples=8, every_n_epochs=1, methods=("gae", "rollout"),
                           modality=TextTokens(special_ids=[1], pad_id=0), faithfulness=FaithfulnessOptions(metrics=()))
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=None, limit_val_batches=None)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.fit(model, train_dataloaders=DataLoader(_spurious_sentences(2000, 0), batch_size=64, shuffle=True),
                    val_dataloaders=DataLoader(_spurious_sentences(64, 1), batch_size=64))
    (flag,) = callback.run.health.flags
    assert (flag.method, flag.cause) == ("gae", "identity")
    found = re.search(r"negligible on (\d+) of (\d+) (tracked samples|samples of the faithfulness subset) \((\d+)%\)",
                      flag.finding)
    assert found is not None and int(found[4]) == round(100 * int(found[1]) / int(found[2])) >= 25
    said = [str(w.message) for w in records if "explanation is not faithful" in str(w.message)]
    assert len(said) == 1 and found[0] in said[0] and found[0] in callback.summary
    # Each negligible map says so in its sample's picture (its header; the Text tab's table carries the same).
    events = read_events(trainer.logger.log_dir)
    texts = {tag: e.tensor_proto.string_val[0].decode().replace("\\", "") for tag in events.Tags()["tensors"]
             if tag.startswith("gae_tokens/") for e in events.Tensors(tag) if e.step == flag.step}
    noted = [float(m) for text in texts.values() for m in re.findall(r"gae: negligible beside the identity \(max (\S+)\)",
                                                                      text)]
    assert noted and all(m < 1e-5 for m in noted) and len(noted) < len(texts) == 8
    assert not any("rollout: negligible" in text for text in texts.values())
