"""The one scoring pipeline: what it scores, and that compare() and GAECallback read the same numbers from it.

The callback logs its scalars to TensorBoard, whose scalar events hold float32; compare's values are Python floats.
A value the callback logs is therefore compared with compare's value rounded to float32 (``np.float32``): equal, not
close. Values that are themselves float32 (region shares, ground truth) round-trip exactly; the perturbation AUCs'
float64 means are rounded once, the same way on both sides.

The methods are chosen so that both faces get the very same relevance: GAE explained alone takes its memory-lean path
in both, while GAE explained beside other methods by the callback (one recorded forward for all) differs from compare's
GAE alone in the last float32 bit of the relevance (about 5e-10), which moves a region's share in its 7th digit. That
is the engine's two paths, not the scoring.
"""

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_gae import TextTokens
from lightning_gae.callbacks import FaithfulnessOptions, GAECallback, RegionOptions
from lightning_gae.compare import compare
from lightning_gae.evaluation import Batch, score_batches
from lightning_gae.metrics.functional import region_share
from lightning_gae.metrics.regions import held_shares
from lightning_gae.modalities.regions import Region

METRICS = ("positive_perturbation_auc", "negative_perturbation_auc", "deletion_auc")


def test_a_region_is_scored_on_the_samples_that_hold_it():
    relevance = torch.tensor([[0.0, 3.0, 1.0, 0.0], [0.0, 1.0, 1.0, 2.0], [0.0, 2.0, 2.0, 0.0]])
    masks = {"word": torch.tensor([[False, True, False, False], [False, False, False, True],
                                   [False, False, False, False]])}  # the third sample has no such token
    scores = score_batches([Batch(torch.ones(3, 4, dtype=torch.long), {"gae": relevance}, regions=masks)], (), None,
                           TextTokens(vocab=["[PAD]", "a"]))
    share = scores.columns()["gae"]["region_share_word"]
    # Plain loop: 3/4 and 2/4, the third left out; the standard error of the mean of two.
    assert (share.value, share.count) == (pytest.approx((0.75 + 0.5) / 2), 2)
    assert share.stderr == pytest.approx(abs(0.75 - 0.5) / 2)
    shares = held_shares(relevance, masks)["word"]
    assert torch.isnan(shares[2])
    assert shares[:2].tolist() == pytest.approx(region_share(relevance[:2], masks["word"][:2]).tolist())


def test_without_attributions_or_metrics_nothing_is_scored():
    scores = score_batches([Batch(torch.ones(2, 3), {})], ("positive_perturbation_auc",), None, TextTokens(vocab=["a"]))
    assert not scores


@pytest.mark.slow
@pytest.mark.parametrize("methods", [("gae",), ("rollout", "attn_gradcam")])
def test_the_callback_and_compare_agree_to_the_digit(tmp_path, methods):
    # The same model and samples through both faces: every faithfulness metric with its standard error, the tabular
    # ground truth and each region's share and recall the callback logs equals compare's. (The two once drifted: the
    # callback collected the tabular ground truth and never scored it.)
    from recipes.tabular import FeatureTokens, TabularClassifier, TabularDataModule

    seed_everything(0)
    split = {"num_train": 256, "num_val": 64, "num_columns": 6, "num_informative": 3}
    modality = FeatureTokens(**split)
    regions = RegionOptions(regions=[Region("informative", "evidence", features=[0, 1, 2]),
                                     Region("last", "suspect", features=[5])], top_k=2, threshold=None)
    callback = GAECallback(num_samples=8, every_n_epochs=1, methods=methods, modality=modality, regions=regions,
                           faithfulness=FaithfulnessOptions(metrics=METRICS, samples=0, max_batch=16))
    trainer = Trainer(max_epochs=1, limit_train_batches=4, logger=TensorBoardLogger(tmp_path, name="tab"),
                      callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, accelerator="cpu", devices=1)
    model = TabularClassifier(num_features=6, dim=16, depth=2, heads=2)
    data = TabularDataModule(batch_size=32, **split)
    trainer.fit(model, datamodule=data)
    events = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]}

    # The callback explains the predictions and checks them against the labels: compare's "predicted" protocol.
    x, y, informative = data.val_set.tensors
    index = torch.tensor(callback.sample_indices)
    result = compare(model.eval(), x[index], target=y[index], methods=(*methods, "random"), modality=modality,
                     ground_truth=informative[index], protocol="predicted", regions=regions, batch_size=len(index),
                     faithfulness=FaithfulnessOptions(metrics=METRICS, max_batch=16))
    expected = {}
    for method, columns in result.methods.items():
        for column, value in columns.items():
            if column != "seconds_per_sample":
                expected[f"{column}/{method}"] = value
                if not column.startswith("region_"):  # the callback logs no standard error of a region's share
                    expected[f"{column}/{method}/stderr"] = result.stderr[method][column]
    families = (*METRICS, "feature_recovery_token_f1", "feature_recovery_auprc", "region_share_informative",
                "region_recall_informative", "region_share_last", "region_recall_last")
    scored = {tag: value for tag, value in logged.items() if tag.split("/")[0] in families}
    assert {tag.split("/")[0] for tag in scored} == set(families)
    # Every value compare finds (a NaN share, no positive relevance on any sample, is left out of the logs) ...
    assert set(scored) == {tag for tag, value in expected.items() if np.isfinite(value)}
    for tag, value in scored.items():
        assert value == np.float32(expected[tag]), tag  # ... and equals compare's to the digit
