"""GAECallback's declared regions: shares logged per method and region beside a random floor, charted apart from
faithfulness, and an alert when a suspect region takes a method's relevance (the shortcut recipe, two seeds), none
when the same cue carries no label."""

import pytest
from lightning.pytorch import seed_everything

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback, RegionOptions
from lightning_gae.modalities.regions import Region
from lightning_gae.tensorboard.method_runs import method_tag
from lightning_gae.tensorboard.summary import custom_scalars_layout, faithfulness_rows
from recipes.shortcuts import SpuriousReviewsDataModule
from recipes.text_rationales import ReviewClassifier, ReviewTokens


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: RegionOptions(regions=["watermark"]), r"RegionOptions\(regions=...\): \['str'\] are not"),
        (lambda: RegionOptions(regions=[Region("a", "suspect", token_ids=[1]), Region("a", "evidence", token_ids=[2])]),
         r"the names \['a', 'a'\] repeat"),
        (lambda: RegionOptions(threshold=1.5), r"RegionOptions\(threshold=1.5\): use a share in \(0, 1\]"),
        (lambda: RegionOptions(rise=0), r"RegionOptions\(rise=0\): use a share in \(0, 1\]"),
        (lambda: RegionOptions(top_k=0), r"RegionOptions\(top_k=0\): use a positive integer"),
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
                           regions=RegionOptions(regions=[data.region], threshold=0.5))
    trainer = make_trainer(tmp_path, [callback], name=f"{'shortcut' if shortcut else 'clean'}_{seed}", max_epochs=3,
                           limit_train_batches=None, limit_val_batches=None)
    trainer.fit(model, datamodule=data)
    return callback, trainer


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_alert_fires_when_the_model_learns_the_spurious_word_and_not_without_it(tmp_path, make_trainer, read_events,
                                                                                    seed, capsys):
    with pytest.warns(UserWarning, match=r"GAECallback: step \d+: \d+% of gae's relevance sits on the suspect region "
                                         r"'spurious_word'"):
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
    assert "the model uses it" in alert.removal
    # The Text tab keeps one entry per tag and step: every alert of a step is in it.
    texts = [t.tensor_proto.string_val[0].decode() for t in events.Tensors("gae_alerts/text_summary")]
    step_text = next(t for t in texts if "gae's relevance" in t)
    assert all(f"{a.method}'s relevance" in step_text for a in callback.run.alerts if a.step == alert.step)
    assert "alerts (suspect regions that took a method's relevance):" in capsys.readouterr().out
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
