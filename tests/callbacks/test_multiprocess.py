"""GAECallback under several processes: DDP and ddp_spawn on two CPU processes (rank zero alone explains and
logs; every rank tracks the samples one process would pick), and the pickling ddp_spawn needs."""

import json
import pickle
import textwrap
from collections import Counter

import pytest

from lightning_gae.callbacks import GAECallback
from recipes.digits import DigitsDataModule
from tests.helpers import processes
from tests.helpers.models import small_vit
from tests.helpers.trainer import heatmap_tag


def test_the_callback_pickles():
    callback = GAECallback(num_samples=3, methods=("gae", "rollout"), dataloader_idx="val")
    copy = pickle.loads(pickle.dumps(callback))
    assert (copy.num_samples, copy.methods, copy.dataloader_idx) == (3, ("gae", "rollout"), "val")


DDP_SCRIPT = """
    import json, sys
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning_gae.callbacks import GAECallback
    from recipes.digits import DigitsDataModule
    from recipes.vit import ViTClassifier

    root = sys.argv[1]
    seed_everything(0)
    callback = GAECallback(num_samples=3, every_n_train_steps=2)
    trainer = Trainer(default_root_dir=root, logger=TensorBoardLogger(root, name="tb"), callbacks=[callback],
                      max_epochs=2, limit_train_batches=3, limit_val_batches=2, accelerator="cpu",
                      strategy="ddp", devices=2, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(ViTClassifier(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    with open(f"{root}/rank_{trainer.global_rank}.json", "w") as f:
        json.dump({"samples": callback.sample_indices, "finished": trainer.state.finished,
                   "summary": callback.summary}, f)
"""


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_logs_once_from_rank_zero(tmp_path, run_script, make_trainer, read_events):
    # Its own session: on a hang, the rank the launcher started is killed along with rank 0.
    done = run_script(DDP_SCRIPT)
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert all(r["finished"] for r in ranks)
    # The summary is rank zero's, printed once.
    assert done.stdout.count("GAECallback: the fit ended") == 1 and ranks[0]["summary"] in done.stdout
    assert ranks[1]["summary"] is None

    # Every event file under the run, whichever rank might have written it: one image per tag and step.
    # (The methods' own runs, methods/<method>, hold scalars only.)
    event_dirs = {p.parent for p in tmp_path.rglob("events.out.tfevents.*") if p.parent.parent.name != "methods"}
    counts = Counter()
    for logdir in event_dirs:
        acc = read_events(logdir)
        for tag in acc.Tags()["images"]:
            counts.update((tag, e.step) for e in acc.Images(tag))
    assert len(event_dirs) == 1
    samples = ranks[0]["samples"]
    # Global steps 2, 4, 6 by step, 3 and 6 by epoch (3 batches an epoch); Lightning logs them at 1, 3, 5
    # and 2 (6 is explained once).
    for sample in samples:
        assert sorted(s for (t, s) in counts if t == f"gae_heatmaps/val_{sample}") == [1, 2, 3, 5]
    assert set(counts.values()) == {1}
    # The faithfulness subset is scored by rank zero: its interim part at the first explanation step and every second
    # after it (1, 3), all of it on the weights of the last step (5).
    acc = read_events(next(iter(event_dirs)))
    assert [e.step for e in acc.Scalars("positive_perturbation_auc/gae")] == [1, 3, 5]
    assert [e.value for e in acc.Scalars("faithfulness_samples")] == [32.0, 32.0, 256.0]

    # Each rank reads a shard of the validation set; the samples are nevertheless those one process picks.
    single = GAECallback(num_samples=3)
    make_trainer(tmp_path / "single", [single], limit_val_batches=2).validate(small_vit(), DigitsDataModule(batch_size=32))
    assert samples == ranks[1]["samples"] == single.sample_indices


DDP_SPAWN_SCRIPT = """
    import sys
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning_gae.callbacks import GAECallback
    from recipes.digits import DigitsDataModule
    from recipes.vit import ViTClassifier

    if __name__ == "__main__":  # spawned processes import this file again
        root = sys.argv[1]
        seed_everything(0)
        trainer = Trainer(default_root_dir=root, logger=TensorBoardLogger(root, name="tb"),
                          callbacks=[GAECallback(num_samples=2, sample_indices=[0, 5], metrics=())],
                          max_epochs=2, limit_train_batches=2, limit_val_batches=1, accelerator="cpu",
                          strategy="ddp_spawn", devices=2, enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=False)
        trainer.fit(ViTClassifier(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=16))
        assert trainer.state.finished
"""


# A spawned rank sometimes aborts in C++ ("terminate called without an active exception", SIGABRT) while
# rank zero explains at the last validation; seen about once in ten runs, at 802ffac too (3 of 8 there), never
# twice in a row. Not understood yet: one more run, and only for that signature, so anything else still fails.
_SPAWN_ABORT = "terminate called without an active exception"


@pytest.mark.slow
def test_ddp_spawn_on_two_cpu_processes(tmp_path, read_events):
    for attempt in (1, 2):
        root = tmp_path / f"run{attempt}"
        root.mkdir()
        (root / "script.py").write_text(textwrap.dedent(DDP_SPAWN_SCRIPT))
        done = processes.run_python([root / "script.py", root], cwd=root)
        if done.returncode == 0:
            break
        assert attempt == 1 and _SPAWN_ABORT in done.stderr, (done.stdout + done.stderr)[-4000:]
    event_dirs = {p.parent for p in root.rglob("events.out.tfevents.*") if p.parent.parent.name != "methods"}
    assert len(event_dirs) == 1
    acc = read_events(event_dirs.pop())
    counts = Counter((tag, e.step) for tag in acc.Tags()["images"] for e in acc.Images(tag))
    for sample in (0, 5):
        assert sorted(s for (t, s) in counts if t == heatmap_tag(sample)) == [1, 3]
    assert set(counts.values()) == {1}, "rank zero alone logs"
