"""What GAECallback's faithfulness subset costs on one process and on several (DDP, FSDP2 or FSDP1, CPU, gloo).

Run from the root of a checkout::

    python -m benchmarks.subset_ranks --processes 2 --strategy fsdp2 --repeats 3

The main job's ViT (``configs/vit_digits.yaml``: width 64, 4 blocks, 17 tokens; ``--dim`` and
``--depth`` change its size) is trained for ten epochs on the digits once. Each run then loads those
weights, fits one step at learning rate 0 (the weights stay as they are) and lets the callback score
its whole subset on them when fit ends (``FaithfulnessOptions(interim_samples=0)``): 256 samples,
the methods ``gae``, ``rollout`` and ``raw_attention`` and the random baseline, positive and negative
perturbation AUC, 256 inputs per forward. What is measured is that scoring (``on_train_end``): the
wall-clock seconds on rank zero, which waits for the gather of every rank's part, and the CPU seconds of
the busiest rank. ``--processes N`` runs with ``strategy="ddp"``, ``ModelParallelStrategy`` with
``fully_shard`` on every block and the ViT (``fsdp2``), or ``FSDPStrategy`` with every block in its own unit
(``fsdp1``; on a CPU through the tests' ``CPUFSDPStrategy``, as Lightning refuses the exact class there); the one
process is the plain unsharded model. Each process
gets one OpenMP thread, so N processes use N cores as N devices would; runs alternate between 1 and N
processes, and the medians and their ratios are printed with the scores of the last run of each (the
same on any number of processes). On a machine busier than its cores the wall-clock ratio says little;
the CPU seconds still show how the work is split.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _train(vit: dict, out: str) -> None:
    """The weights every run scores with: ten epochs on one process."""
    import torch
    from lightning.pytorch import Trainer, seed_everything

    from recipes.digits import DigitsDataModule
    from recipes.vit import ViTClassifier

    seed_everything(0)
    model = ViTClassifier(**vit)
    Trainer(accelerator="cpu", devices=1, max_epochs=10, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False).fit(model, DigitsDataModule(batch_size=64))
    torch.save(model.state_dict(), out)


def _score_once(processes: int, strategy: str, vit: dict, weights: str, out: str) -> None:
    """One fit of one step on ``processes`` processes; rank zero writes the scoring's seconds and scores to ``out``."""
    import torch
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.strategies import ModelParallelStrategy
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.distributed.fsdp import fully_shard

    from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
    from recipes.digits import DigitsDataModule
    from recipes.vit import ViTClassifier

    class ShardedViT(ViTClassifier):
        def configure_model(self) -> None:
            mesh = self.device_mesh["data_parallel"]
            for block in self.model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.model, mesh=mesh)

    class Timed(GAECallback):
        def on_train_end(self, trainer, pl_module) -> None:
            start, cpu = time.perf_counter(), time.process_time()
            super().on_train_end(trainer, pl_module)
            self.seconds = time.perf_counter() - start
            busiest = trainer.strategy.reduce(torch.tensor(time.process_time() - cpu, dtype=torch.float64), reduce_op="max")
            self.cpu_seconds = float(busiest)

    seed_everything(0)
    sharded = processes > 1 and strategy == "fsdp2"
    model = (ShardedViT if sharded else ViTClassifier)(**vit, lr=0.0)
    model.load_state_dict(torch.load(weights))
    if processes == 1 or strategy == "ddp":
        chosen = "auto" if processes == 1 else "ddp"
    elif strategy == "fsdp2":
        chosen = ModelParallelStrategy(data_parallel_size=processes, tensor_parallel_size=1)
    else:
        from recipes.vit import Block
        from tests.helpers.trainer import CPUFSDPStrategy

        chosen = CPUFSDPStrategy(auto_wrap_policy={Block})
    callback = Timed(num_samples=1, every_n_epochs=None, every_n_train_steps=10**6,
                     methods=("gae", "rollout", "raw_attention"), print_summary=False,
                     faithfulness=FaithfulnessOptions(interim_samples=0))
    with tempfile.TemporaryDirectory(prefix="lightning-gae-subset-") as root:
        trainer = Trainer(default_root_dir=root, logger=TensorBoardLogger(root), callbacks=[callback],
                          accelerator="cpu", devices=processes, strategy=chosen, max_steps=1, limit_val_batches=0,
                          num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=False)
        trainer.fit(model, DigitsDataModule(batch_size=64))
        if trainer.is_global_zero:
            events = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0})
            events.Reload()
            scores = {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"] if "perturbation_auc" in tag}
            Path(out).write_text(json.dumps({"seconds": callback.seconds, "cpu_seconds": callback.cpu_seconds,
                                             "scores": scores}))


def _child(*args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(_REPO), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "benchmarks.subset_ranks", *args], cwd=_REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _run(processes: int, strategy: str, vit: list[str], weights: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lightning-gae-subset-") as tmp:
        out = os.path.join(tmp, "result.json")
        _child("--child", str(processes), "--strategy", strategy, *vit, "--weights", weights, "--out", out)
        return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--strategy", choices=("ddp", "fsdp2", "fsdp1"), default="fsdp2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64, help="the ViT's width (the main job's: 64)")
    parser.add_argument("--depth", type=int, default=4, help="its blocks (the main job's: 4)")
    parser.add_argument("--output", help="add this run's medians to this JSON file ({'subset_ranks': [...]}, one row per "
                                         "model size, strategy and process count; a row measured again is replaced)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--train", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    vit = {"dim": args.dim, "depth": args.depth, "heads": 4}
    sizes = ["--dim", str(args.dim), "--depth", str(args.depth)]
    if args.train is not None:
        _train(vit, args.train)
        return
    if args.child is not None:
        _score_once(args.child, args.strategy, vit, args.weights, args.out)
        return
    wall: dict[int, list[float]] = {1: [], args.processes: []}
    cpu: dict[int, list[float]] = {1: [], args.processes: []}
    last: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="lightning-gae-subset-") as tmp:
        weights = os.path.join(tmp, "vit.pt")
        print("training the ViT for 10 epochs (one process)...", flush=True)
        _child("--train", weights, *sizes)
        for repeat in range(args.repeats):
            for processes in (1, args.processes) if repeat % 2 == 0 else (args.processes, 1):
                last[processes] = _run(processes, args.strategy, sizes, weights)
                wall[processes].append(last[processes]["seconds"])
                cpu[processes].append(last[processes]["cpu_seconds"])
                print(f"repeat {repeat + 1}/{args.repeats}: {processes} process(es), {args.strategy}: "
                      f"{wall[processes][-1]:.2f} s wall, {cpu[processes][-1]:.2f} s CPU (busiest rank)", flush=True)
    n = args.processes
    one, many = statistics.median(wall[1]), statistics.median(wall[n])
    one_cpu, many_cpu = statistics.median(cpu[1]), statistics.median(cpu[n])
    print(f"subset scoring (ViT width {args.dim}, {args.depth} blocks, 256 samples), medians: 1 process {one:.2f} s wall / {one_cpu:.2f} s CPU; {n} processes "
          f"({args.strategy}) {many:.2f} s wall / {many_cpu:.2f} s CPU on the busiest rank; ratios {many / one:.2f} "
          f"wall, {many_cpu / one_cpu:.2f} CPU; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    same = all(abs(last[1]["scores"][tag] - last[args.processes]["scores"][tag]) < 1e-6 for tag in last[1]["scores"])
    print(f"the same scores and standard errors on both: {same}")
    for tag in sorted(last[1]["scores"]):
        print(f"  {tag}: {last[1]['scores'][tag]:.4f} / {last[args.processes]['scores'][tag]:.4f}")
    if args.output:
        row = {"dim": args.dim, "depth": args.depth, "strategy": args.strategy, "processes": n, "repeats": args.repeats,
               "one": {"seconds": one, "cpu_seconds": one_cpu}, "many": {"seconds": many, "cpu_seconds": many_cpu},
               "same_scores": same}
        path = Path(args.output)
        rows = json.loads(path.read_text())["subset_ranks"] if path.exists() else []
        key = ("dim", "depth", "strategy", "processes")
        rows = [r for r in rows if any(r[k] != row[k] for k in key)] + [row]
        path.write_text(json.dumps({"subset_ranks": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
