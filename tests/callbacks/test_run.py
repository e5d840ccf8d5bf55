"""The callback's Run owns what a checkpoint keeps: the callback's state_dict is the run's, in the format older
checkpoints have (``sample_indices``, ``previous``), and the callback's public attributes read the run."""

import torch

from lightning_gae.callbacks import BatchOptions, GAECallback


def test_the_callbacks_checkpoint_state_is_its_runs_and_round_trips():
    callback = GAECallback(batches=BatchOptions(sample_indices=[3, 1]))
    assert callback.sample_indices == [3, 1] == callback.run.sample_indices
    callback.run.previous = {"gae": torch.arange(10.0).reshape(2, 5)}
    saved = callback.state_dict()
    assert sorted(saved) == ["previous", "sample_indices"]
    resumed = GAECallback()
    assert resumed.sample_indices is None
    resumed.load_state_dict(saved)
    assert resumed.sample_indices == [3, 1] and torch.equal(resumed.run.previous["gae"], saved["previous"]["gae"])


def test_a_checkpoint_without_the_keys_keeps_the_given_samples():
    callback = GAECallback(batches=BatchOptions(sample_indices=[2]))
    callback.load_state_dict({})
    assert callback.sample_indices == [2] and callback.run.previous == {}
    callback.sample_indices = (4, 0)
    assert callback.run.sample_indices == [4, 0] and callback.summary is None is callback.run.summary
