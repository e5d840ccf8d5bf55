"""The callback's hooks around its Run: one GAECallback per Trainer."""

import pytest

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from recipes.digits import DigitsDataModule
from tests.helpers.models import small_vit


def test_a_second_gae_callback_stops_the_run_at_setup_naming_both(tmp_path, make_trainer):
    # Both used to run, writing the same tags (gae_heatmaps/val_<i>, relevance/<method>, the GAE tab's summaries) twice
    # at the same steps into one logger, without a word.
    quiet = FaithfulnessOptions(metrics=(), random_baseline=False)
    first, second = (GAECallback(num_samples=2, methods=m, faithfulness=quiet) for m in (["gae"], ["rollout"]))
    trainer = make_trainer(tmp_path, [first, second])
    with pytest.raises(ValueError, match=r"the Trainer holds 2 GAECallbacks, trainer\.callbacks\[0\] \(methods=\['gae'\], "
                                         r"num_samples=2\) and trainer\.callbacks\[1\] \(methods=\['rollout'\], "
                                         r"num_samples=2\).*Keep one GAECallback and give it every method"):
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    assert trainer.global_step == 0
    assert first.sample_indices is None and second.sample_indices is None  # refused before either read a sample
