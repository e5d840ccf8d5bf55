"""GAECallback's declared regions: shares logged per method and region beside a random floor, charted apart from
faithfulness, and an alert when a suspect region takes more of a method's relevance than chance puts there (the
shortcut recipe, two seeds; a Hugging Face ViT whose only cue is a corner patch), none when the same cue carries no
label or the region is the whole input; a removal check that says when its samples cannot tell; regions that match
nothing said so, and a region that cannot be found refused when fit starts."""

import re

import pytest
import torch
import transformers
from lightning.pytorch import LightningModule, seed_everything
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback, RegionOptions
from lightning_gae.modalities.regions import Region
from lightning_gae.tensorboard.method_runs import method_tag
from lightning_gae.tensorboard.summary import custom_scalars_layout, faithfulness_rows
from recipes.shortcuts import SpuriousReviewsDataModule, WatermarkedDigitsDataModule
from recipes.text_rationales import ReviewClassifier, ReviewTokens
from recipes.vit import ViTClassifier


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: RegionOptions(regions=["watermark"]), r"RegionOptions\(regions=...\): \['str'\] are not"),
        (lambda: RegionOptions(regions=[Region("a", "suspect", token_ids=[1]), Region("a", "evidence", token_ids=[2])]),
         r"the names \['a', 'a'\] repeat"),
        (lambda: RegionOptions(threshold=1.5), r"RegionOptions\(threshold=1.5\): use a share in \(0, 1\]"),
        (lambda: RegionOptions(rise=0), r"RegionOptions\(rise=0\): use a share in \(0, 1\]"),
        (lambda: RegionOptions(top_k=0), r"RegionOptions\(top_k=0\): use a positive integer"),
        (lambda: RegionOptions(margin=1.0), r"RegionOptions\(margin=1.0\): use share points above chance, a number in \[0, 1\)"),
        (lambda: RegionOptions(margin=-0.1), r"RegionOptions\(margin=-0.1\): use share points"),
        (lambda: GAECallback(regions=[Region("a", "suspect", token_ids=[1])]), r"GAECallback\(regions=.*give a RegionOptions"),
    ],
)
def test_bad_region_options_are_refused_when_built(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_region_scalars_are_charted_apart_from_faithfulness():
    # They are plausibility (where relevance sits), not faithfulness: no faithfulness table row, no rank on the tab.
    scalars = {"region_share_word/gae": 0.7, "region_share_word/random": 0.1, "positive_perturbation_auc/gae": 30.0}
    metrics, rows = faithfulness_rows(scalars)
    assert metrics == ["positive_perturbation_auc"] and [r[0] for r in rows] == ["gae"]
    assert method_tag("region_share_word/gae") == ("gae", "gae_regions/region_share_word")
    layout = custom_scalars_layout(["region_share_word", "positive_perturbation_auc"])
    assert layout["GAE regions"] == {"region_share_word": ["Multiline", ["^gae_regions/region_share_word$"]]}
    assert list(layout["GAE faithfulness"]) == ["positive_perturbation_auc"]


def _fit(tmp_path, make_trainer, shortcut: bool, seed: int):
    seed_everything(seed)
    data = SpuriousReviewsDataModule(shortcut=shortcut, correlation=0.95, sentiment_noise=0.2, num_train=4000,
                                     num_val=512, max_length=32, batch_size=64, seed=seed)
    model = ReviewClassifier(max_length=32, dim=64, depth=2, heads=4, dropout=0.1, lr=0.003)
    callback = GAECallback(num_samples=8, methods=("gae", "rollout"), modality=ReviewTokens(),
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=64,
                                                            every_n_explanations=1),
                           regions=RegionOptions(regions=[data.region]))
    trainer = make_trainer(tmp_path, [callback], name=f"{'shortcut' if shortcut else 'clean'}_{seed}", max_epochs=3,
                           limit_train_batches=None, limit_val_batches=None)
    trainer.fit(model, datamodule=data)
    return callback, trainer


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_alert_fires_when_the_model_learns_the_spurious_word_and_not_without_it(tmp_path, make_trainer, read_events,
                                                                                    seed, capsys):
    with pytest.warns(UserWarning, match=r"GAECallback: step \d+: \d+% of gae's relevance sits on the suspect region "
                                         r"'spurious_word', where chance puts \d+\.\d%"):
        callback, trainer = _fit(tmp_path / "shortcut", make_trainer, shortcut=True, seed=seed)
    events = read_events(trainer.logger.log_dir)
    logged = events.scalar_events("region_share_spurious_word/")
    shares = {m: logged[f"region_share_spurious_word/{m}"] for m in ("gae", "rollout", "random")}
    assert all(len(values) == 3 for values in shares.values())        # every explanation step, random the floor
    assert shares["gae"][-1][1] > 0.5 > shares["random"][-1][1]
    alerts = {(a.region, a.method) for a in callback.run.alerts}
    assert ("spurious_word", "gae") in alerts
    alert = next(a for a in callback.run.alerts if a.method == "gae")
    assert alert.share >= 0.5 and len(alert.samples) == 3 and "positive_perturbation_auc" in alert.faithfulness
    assert alert.excess > 2 * alert.stderr and alert.excess > 0.05 and alert.rule == "chance"
    # The removal check runs on the faithfulness subset (64 samples, about half of them hold the word).
    assert "the model uses it" in alert.removal and re.search(r"on the \d+ of 64 faithfulness subset samples", alert.removal)
    # The Text tab keeps one entry per tag and step: every alert of a step is in it.
    texts = [t.tensor_proto.string_val[0].decode() for t in events.Tensors("gae_alerts/text_summary")]
    step_text = next(t for t in texts if "gae's relevance" in t)
    assert all(f"{a.method}'s relevance" in step_text for a in callback.run.alerts if a.step == alert.step)
    out = capsys.readouterr().out
    assert "alerts (declared regions whose share of relevance differs from chance):" in out
    assert re.search(r"'spurious_word': scored on the \d of 8 tracked samples that hold it", out)
    # The same cue carrying no label: nothing to warn about, and the share stays near the floor.
    clean, clean_trainer = _fit(tmp_path / "clean", make_trainer, shortcut=False, seed=seed)
    assert clean.run.alerts == []
    clean_events = read_events(clean_trainer.logger.log_dir)
    assert clean_events.scalar_events("region_share_spurious_word/gae")["region_share_spurious_word/gae"][-1][1] < 0.5


@pytest.mark.slow
def test_regions_from_data_are_the_datamodules_own_and_a_datamodule_without_them_is_refused(tmp_path, make_trainer,
                                                                                            read_events):
    # What a YAML config uses (configs/shortcut_*.yaml): it cannot build a Region, the data module has one.
    seed_everything(0)
    data = SpuriousReviewsDataModule(num_train=256, num_val=64, max_length=32, batch_size=64, seed=0)
    callback = GAECallback(num_samples=4, methods=("gae",), modality=ReviewTokens(),
                           faithfulness=FaithfulnessOptions(metrics=()), regions=RegionOptions(from_data=True))
    trainer = make_trainer(tmp_path, [callback], name="from_data", max_epochs=1)
    trainer.fit(ReviewClassifier(max_length=32, dim=32, depth=1, heads=2), datamodule=data)
    assert [r.name for r in callback.regions.regions] == [data.region.name] and not callback.regions.from_data
    tags = read_events(trainer.logger.log_dir).Tags()["scalars"]
    assert f"region_share_{data.region.name}/gae" in tags and f"region_share_{data.region.name}/random" in tags

    class NoRegion(SpuriousReviewsDataModule):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.region = None

    callback = GAECallback(num_samples=4, methods=("gae",), modality=ReviewTokens(),
                           faithfulness=FaithfulnessOptions(metrics=()), regions=RegionOptions(from_data=True))
    trainer = make_trainer(tmp_path, [callback], name="no_region", max_epochs=1)
    with pytest.raises(ValueError, match=r"RegionOptions\(from_data=True\)\): the datamodule \(NoRegion\) has no "
                                         r"`region` or `regions` attribute"):
        trainer.fit(ReviewClassifier(max_length=32, dim=32, depth=1, heads=2),
                    datamodule=NoRegion(num_train=256, num_val=64, max_length=32, batch_size=64, seed=0))


# --- a Hugging Face ViT whose only cue is a corner patch --------------------------------------------------------


class CornerViT(LightningModule):
    """A tiny Hugging Face ViT on dict batches ``{"pixel_values", "labels"}``, trained on its own loss."""

    def __init__(self) -> None:
        super().__init__()
        self.model = transformers.ViTForImageClassification(transformers.ViTConfig(
            image_size=32, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, num_labels=2))

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values=pixel_values).logits

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def corner_images(n: int, cue: bool, seed: int) -> list[dict[str, Tensor]]:
    """Noise images whose top-left 4 x 4 patch (1 of 64) is brighter for class 1 and darker for class 0 (``cue``), or
    brighter or darker at random (the shortcut-free validation set)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g) * 0.5
    y = torch.randint(2, (n,), generator=g)
    corner = y if cue else torch.randint(2, (n,), generator=g)
    x[:, :, :4, :4] += (corner.float() * 4 - 2).view(-1, 1, 1, 1)
    return [{"pixel_values": x[i], "labels": y[i]} for i in range(n)]


@pytest.mark.slow
def test_a_corner_shortcut_of_a_hugging_face_vit_alerts_by_default_and_the_whole_image_does_not(tmp_path, make_trainer,
                                                                                                read_events):
    seed_everything(0)
    pixels = torch.zeros(32, 32, dtype=torch.bool)
    pixels[:4, :4] = True
    corner = Region("corner", "suspect", mask=pixels)
    everything = Region("everything", "suspect", mask=torch.ones(32, 32, dtype=torch.bool))
    rest = Region("rest", "evidence", mask=~pixels)     # where the evidence should be: too little of it there
    callback = GAECallback(num_samples=8, methods=("gae", "rollout"),
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=32),
                           regions=RegionOptions(regions=[corner, everything, rest]))
    trainer = make_trainer(tmp_path, [callback], max_epochs=6, limit_train_batches=None, limit_val_batches=None)
    model = CornerViT()
    trainer.fit(model, DataLoader(corner_images(512, True, 0), batch_size=32, shuffle=True),
                DataLoader(corner_images(64, False, 1), batch_size=32))
    # The model has learnt the corner and nothing else: right on the training set, at chance without the cue.
    model.eval()
    with torch.no_grad():
        train = corner_images(512, True, 0)
        x, y = torch.stack([s["pixel_values"] for s in train]), torch.stack([s["labels"] for s in train])
        assert (model(x).argmax(1) == y).float().mean() > 0.95
    alerts = [a for a in callback.run.alerts if a.region == "corner"]
    assert "gae" in {a.method for a in alerts}
    alert = next(a for a in alerts if a.method == "gae")
    # The message states the share, chance's share (1 of the 64 patches), the excess ± its error and the samples.
    assert alert.floor == pytest.approx(1 / 64) and alert.count == 8 and alert.excess > max(0.05, 2 * alert.stderr)
    assert re.search(r"\d+% of gae's relevance sits on the suspect region 'corner', where chance puts 1\.6%", alert.text())
    assert re.search(r"share minus chance: \+\d+\.\d% ± \d+\.\d% \(standard error\) over 8 samples", alert.text())
    assert "the model uses it" in " ".join(a.removal for a in alerts)
    # The rest of the image, as evidence: less of GAE's relevance than chance's 63 of 64 patches.
    evidence = next(a for a in callback.run.alerts if a.region == "rest" and a.method == "gae")
    assert evidence.kind == "evidence" and evidence.excess < -max(0.05, 2 * evidence.stderr)
    assert re.search(r"of gae's relevance sits on the evidence region 'rest', where chance puts 98\.4%", evidence.text())
    # The whole image: every method's share is chance's, whatever it is.
    assert [a for a in callback.run.alerts if a.region == "everything"] == []
    shares = read_events(trainer.logger.log_dir).scalar_events("region_share_everything/gae")["region_share_everything/gae"]
    assert shares and all(value == pytest.approx(1.0) for _, value in shares)


@pytest.mark.slow
def test_an_alert_raised_before_the_model_uses_the_corner_is_followed_up_once_when_it_does(tmp_path, make_trainer,
                                                                                          read_events):
    # GAE's relevance goes to the corner before the model decides by it: the first alert's removal check finds no use,
    # and a later one does; that later finding is raised once, as a follow-up of the first alert.
    seed_everything(0)
    pixels = torch.zeros(32, 32, dtype=torch.bool)
    pixels[:4, :4] = True
    callback = GAECallback(num_samples=8, methods=("gae", "rollout"),
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=32),
                           regions=RegionOptions(regions=[Region("corner", "suspect", mask=pixels)]))
    trainer = make_trainer(tmp_path, [callback], max_epochs=6, limit_train_batches=None, limit_val_batches=None)
    trainer.fit(CornerViT(), DataLoader(corner_images(512, True, 0), batch_size=32, shuffle=True),
                DataLoader(corner_images(64, False, 1), batch_size=32))
    gae = [a for a in callback.run.alerts if a.method == "gae"]
    assert len(gae) == 2, [a.text() for a in gae]
    first, later = gae
    assert first.uses is False and first.follows is None and "the model uses it" not in first.removal
    assert re.search(r"the model does not rely on it|too few samples to tell", first.removal), first.removal
    assert later.step > first.step and later.uses is True and later.follows == first.step
    assert later.rule == "follow-up" and later.removal.endswith(": the model uses it")
    assert later.text().startswith(f"step {later.step}: the model now uses the suspect region 'corner' (gae's alert "
                                   f"of step {first.step} came before it did); ")
    # A method first alerted once the model uses the region gets no follow-up: its alert said so already.
    assert all(a.follows is None for a in callback.run.alerts if a.method != "gae")
    # Written to the Text tab and the GAE tab at its own step.
    events = read_events(trainer.logger.log_dir)
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("gae_alerts/text_summary")}
    assert "the model now uses the suspect region 'corner'" in texts[later.step]
    # Kept by the checkpoint's state as the other alerts are; an alert of an older checkpoint (without the removal
    # check's finding) loads, and is not known to wait for a follow-up.
    state = callback.state_dict()
    assert [(a["uses"], a["follows"]) for a in state["alerts"] if a["method"] == "gae"] == [(False, None),
                                                                                           (True, first.step)]
    resumed = GAECallback(num_samples=8, regions=RegionOptions(regions=[Region("corner", "suspect", mask=pixels)]))
    resumed.load_state_dict(state)
    assert [(a.uses, a.follows) for a in resumed.run.alerts] == [(a.uses, a.follows) for a in callback.run.alerts]
    older = dict(state, alerts=[{k: v for k, v in a.items() if k not in ("uses", "follows")} for a in state["alerts"]])
    resumed.load_state_dict(older)
    assert [a.uses for a in resumed.run.alerts] == [None] * len(state["alerts"])


# --- what cannot be told, and what cannot be scored --------------------------------------------------------------


@pytest.mark.slow
def test_two_tracked_samples_are_too_few_for_the_removal_check_and_an_empty_region_is_not_scored(tmp_path, make_trainer,
                                                                                                read_events, capsys):
    seed_everything(0)
    data = WatermarkedDigitsDataModule(shortcut=True, seed=0)
    nothing = Region("nothing", "suspect", mask=torch.zeros(8, 8, dtype=torch.bool))
    # threshold: an absolute rule, as the option still allows; chance would need MIN_SAMPLES samples.
    callback = GAECallback(num_samples=2, methods=("gae",), faithfulness=FaithfulnessOptions(samples=0),
                           regions=RegionOptions(regions=[data.region, nothing], threshold=0.01))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    with pytest.warns(UserWarning, match=r"GAECallback: region 'nothing' is not scored: it matches no token of any of "
                                         r"the 2 tracked samples"):
        trainer.fit(ViTClassifier(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=2),
                    datamodule=data)
    alert = next(a for a in callback.run.alerts if a.region == "watermark")
    assert alert.rule == "threshold"
    assert re.search(r"removal check: on the 2 of 2 tracked samples that hold it, .*: too few samples to tell \(fewer "
                     r"than 3\)", alert.removal), alert.removal
    assert "does not rely on it" not in alert.removal and "uses it" not in alert.removal
    out = capsys.readouterr().out
    assert "'nothing': not scored: it matches no token of any of the 2 tracked samples" in out
    assert "'watermark': scored on the 2 of 2 tracked samples that hold it" in out
    events = read_events(trainer.logger.log_dir)
    assert not any(tag.startswith("region_share_nothing/") for tag in events.Tags()["scalars"])
    # The GAE tab lists the region as not scored among the alerts (and the Text tab shows it).
    texts = [t.tensor_proto.string_val[0].decode() for t in events.Tensors("gae_alerts/text_summary")]
    assert any("region 'nothing' is not scored" in t for t in texts)
    tensors = [tag for tag in events.Tags()["tensors"] if "/alert/nothing/" in tag]
    assert tensors == [f"{tensors[0].split('/alert/')[0]}/alert/nothing/not_scored"]


def _reviews(tmp_path, make_trainer, region: Region, name: str):
    seed_everything(0)
    data = SpuriousReviewsDataModule(num_train=128, num_val=32, max_length=32, batch_size=32, seed=0)
    callback = GAECallback(num_samples=4, methods=("gae",), modality=ReviewTokens(),
                           faithfulness=FaithfulnessOptions(metrics=()), regions=RegionOptions(regions=[region]))
    trainer = make_trainer(tmp_path, [callback], name=name, max_epochs=1)
    trainer.fit(ReviewClassifier(max_length=32, dim=32, depth=1, heads=2), datamodule=data)
    return callback


@pytest.mark.slow
def test_a_token_id_outside_the_vocabulary_says_so_and_a_predicate_that_raises_is_refused_naming_the_region(
        tmp_path, make_trainer):
    with pytest.warns(UserWarning, match=r"region 'unknown_word' is not scored: it matches no token of any of the 4"):
        _reviews(tmp_path, make_trainer, Region("unknown_word", "suspect", token_ids=[100_000]), "unknown")

    def broken(ids: Tensor) -> Tensor:
        raise KeyError("no such word")

    with pytest.raises(ValueError, match=r"Region 'broken' could not be found in the samples' tokens \(KeyError"):
        _reviews(tmp_path, make_trainer, Region("broken", "suspect", predicate=broken), "broken")
