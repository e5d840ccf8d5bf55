"""``python -m benchmarks.bench``: what an explanation costs next to one training step, Captum and the reference code.

A script of the repository, not of the wheel: it measures ``recipes/``'s ViT and the main job's config
(``configs/vit_digits.yaml``), which the wheel does not ship; run it from the root of a checkout.

Methods, on the same batch of one model:

* ``forward_backward``: one forward + backward of the model as it is trained (train mode, fused
  SDPA, cross-entropy on the logits, parameter gradients): the floor;
* ``gae``: :func:`lightning_gae.explain` as it runs by default;
* ``gae_matrix``: the dense matrix form, ``R = (I + Ā_L) ⋯ (I + Ā_1)`` for the whole batch
  (:class:`~lightning_gae.AttentionRecorder`, one ``autograd.grad``, :func:`~lightning_gae.engine.rules.gae_relevance`),
  its CLS row read afterwards;
* ``per_sample_loop``: the same, one sample at a time, as the reference implementation works;
* ``rollout``: ``explain(method="rollout")``;
* ``saliency`` and ``integrated_gradients``: Captum on the input (images) or on ``inputs_embeds``
  (text), ``n_steps=50``, at most ~64 x 257 tokens per internal batch.

Cases: a ViT (``recipes.vit.ViT``) at batch 1, 16, 64 with N = 65 and 257 tokens; a BERT-mini
shaped ``BertForSequenceClassification`` (4 layers, width 256, SDPA) at N = 257, 1025, 2049; ``flow``
(attention flow per token count); ``llama``, a ``LlamaForCausalLM`` (4 layers, width 256, 8 query and
2 key/value heads, SDPA) at batch 1 with N = 1024, 4096, 8192, explaining the last position's
next-token logit against a language-model training step over every position; and ``main_job``, the fit of ``configs/vit_digits.yaml`` through LightningCLI without and with its
``GAECallback`` (same seed and epochs).

Timing: each method runs once as a warm-up, then ``repeats`` rounds go through the methods in
turn (a method leaves once it has used its time budget); ``seconds`` is the median, and
``cpu_seconds`` the median CPU time of the process over the same calls (every thread's; another job on
the machine moves it less than wall seconds, so the target table gives each time ratio in both). Peak memory is measured identically for every method:
before each repeat, garbage is collected and the allocator's free pages are given back
(``malloc_trim``; on CUDA the peak statistics are reset), then the peak resident set size of the
process is reset (``/proc/self/clear_refs``) and the resident size read as the baseline;
``peak_memory_mb`` is the largest rise of the peak (``VmHWM``) over that baseline. It counts
everything a method allocates, tensors and Python objects alike (PyTorch's CPU allocations are
invisible to ``tracemalloc``). Each case runs in a fresh process, so one case's allocations and
warm caches do not carry over into the next.

The machine's load moves absolute seconds; the ratios to ``forward_backward`` measured seconds
apart in one process are what to read.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MODEL_METHODS", "FIT_METHODS", "FLOW_METHODS", "LRP_BENCH_METHODS", "LLAMA_METHODS", "Case", "Interrupted",
           "full_cases", "quick_cases", "select_cases", "run", "ratio_report", "main"]

MODEL_METHODS: tuple[str, ...] = (
    "forward_backward", "gae", "gae_matrix", "per_sample_loop", "rollout", "saliency", "integrated_gradients",
)
FIT_METHODS: tuple[str, ...] = ("fit_without_callback", "fit_with_callback")
FLOW_METHODS: tuple[str, ...] = ("forward_backward", "gae", "rollout", "attention_flow")
"""The ``flow`` cases: attention flow (one max flow per token and sample) per token count, one sample."""
LRP_BENCH_METHODS: tuple[str, ...] = ("attnlrp", "transformer_attribution")
LLAMA_METHODS: tuple[str, ...] = ("forward_backward", "gae", "rollout", "attnlrp")
KERNEL_BENCH_METHODS: tuple[str, ...] = ("gae_triton", "gae_triton2", "gae_chunks")
"""Measured only when ``--methods`` names them: ``gae`` with its row form as a Triton kernel (a GPU's, or
Triton's CPU interpreter): the first (``LIGHTNING_GAE_KERNEL=triton``, :mod:`lightning_gae.engine.triton_gae`) or the
FlashAttention-2-shaped one (``triton2``, :mod:`lightning_gae.engine.triton_gae_fa2`, CUDA's default); or as the
chunks (``chunks``, the default elsewhere)."""
_KERNEL_ENV = {"gae_triton": "triton", "gae_triton2": "triton2", "gae_chunks": "chunks"}
SELECTABLE_CASES = ("vit", "bert", "llama")
"""The cases whose methods ``--methods`` selects (``forward_backward`` and ``gae``, the floors, always run)."""
"""The ``llama`` cases (a decoder-only LM at batch 1, long prompts): the last position's next-token logit."""
"""Beside the model methods in the ViT and BERT cases: the LRP family (:data:`lightning_gae.LRP_METHODS`)."""
_IG_STEPS = 50
# Rows per Captum internal batch are chosen so that one holds about as many tokens as the largest
# ViT batch (64 x 257): IG's memory stays that of a training step while its steps stay batched.
_IG_TOKENS = 64 * 257
_REPO = Path(__file__).resolve().parent.parent
_PROG = "python -m benchmarks.bench"
# The first argument of a case's own process (run() starts one per case): it measures the case and writes its rows.
_WORKER = "--measure-case"
_MAIN_CONFIG = _REPO / "configs" / "vit_digits.yaml"


@dataclass(frozen=True)
class Case:
    """One benchmarked setting.

    ``name`` is ``"vit"``, ``"bert"``, ``"flow"`` (the ViT, attention flow's methods) or ``"main_job"``;
    ``size`` holds the model's width (``dim``/``depth``/``heads`` for the ViT, ``hidden``/``layers``/``heads`` for BERT) and, for
    ``main_job``, the config path and an optional ``max_epochs`` override.
    """

    name: str
    batch: int
    tokens: int
    size: dict[str, Any] = field(default_factory=dict)
    only: tuple[str, ...] | None = None
    """The model cases' methods to measure besides ``forward_backward`` and ``gae`` (None: all of them)."""

    @property
    def methods(self) -> tuple[str, ...]:
        if self.name in ("vit", "bert"):
            # The LRP methods beside GAE (their forward computes different gradients: their own passes).
            methods = (*MODEL_METHODS, *LRP_BENCH_METHODS)
        else:
            methods = {"main_job": FIT_METHODS, "flow": FLOW_METHODS, "llama": LLAMA_METHODS}.get(self.name, MODEL_METHODS)
        if self.only is None or self.name not in SELECTABLE_CASES:
            return methods
        kernels = tuple(m for m in KERNEL_BENCH_METHODS if m in self.only)
        return tuple(m for m in methods if m in ("forward_backward", "gae") or m in self.only) + kernels


_VIT = {"dim": 192, "depth": 6, "heads": 3}
_BERT = {"hidden": 256, "layers": 4, "heads": 4}
_LLAMA = {"hidden": 256, "layers": 4, "heads": 8, "kv_heads": 2}


def full_cases(config: str | Path = _MAIN_CONFIG) -> list[Case]:
    """The CPU cases: ViT batch 1/16/64 at N = 65/257, BERT at N = 257/1025/2049, the main job."""
    vit = [Case("vit", batch, tokens, dict(_VIT)) for tokens in (65, 257) for batch in (1, 16, 64)]
    # Batches sized so that the dense matrix forms (every layer's N x N maps kept) fit a 24 GiB device.
    bert = [Case("bert", batch, tokens, dict(_BERT)) for batch, tokens in ((8, 257), (2, 1025), (1, 2049))]
    flow = [Case("flow", 1, tokens, dict(_VIT)) for tokens in (17, 65, 257)]
    llama = [Case("llama", 1, tokens, dict(_LLAMA)) for tokens in (1024, 4096, 8192)]
    return [*vit, *bert, *flow, *llama, _main_job_case(config, None)]


def gpu_cases(config: str | Path = _MAIN_CONFIG) -> list[Case]:
    """Issue 24's sizes, as users train on a GPU (``--sizes gpu``): a ViT-B/16-sized model (width 768, 12 layers,
    12 heads) at batch 64 and N = 197, a BERT-base-sized encoder at N = 512 (batch 8) and 4096 (batch 1), a
    Llama-style decoder (width 1024, 8 layers, 16 heads, 4 key-value heads) at 8192 tokens, the main job."""
    base = {"hidden": 768, "layers": 12, "heads": 12}
    return [Case("vit", 64, 197, {"dim": 768, "depth": 12, "heads": 12}),
            Case("bert", 8, 512, dict(base)), Case("bert", 1, 4096, dict(base)),
            Case("llama", 1, 8192, {"hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 4}),
            _main_job_case(config, None)]


def quick_cases(config: str | Path = _MAIN_CONFIG) -> list[Case]:
    """Every case kind and method on tiny models and a 3-epoch main job: a smoke test, not a measurement."""
    return [
        Case("vit", 2, 17, {"dim": 32, "depth": 2, "heads": 2}),
        Case("bert", 2, 33, {"hidden": 32, "layers": 2, "heads": 2}),
        Case("flow", 1, 17, {"dim": 32, "depth": 2, "heads": 2}),
        Case("llama", 1, 64, {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2}),
        _main_job_case(config, 3),
    ]


def select_cases(cases: Sequence[Case], names: Sequence[str], tokens: Sequence[int] | None = None,
                 methods: Sequence[str] | None = None) -> list[Case]:
    """The cases of the kinds in ``names`` and, with ``tokens``, of those token counts only; with ``methods``, the
    model cases measure those besides ``forward_backward`` and ``gae`` (e.g. the long prompts without the methods
    whose memory grows as N²)."""
    chosen = [c for c in cases if c.name in names and (tokens is None or c.tokens in tokens)]
    return chosen if methods is None else [replace(c, only=tuple(methods)) for c in chosen]


def _main_job_case(config: str | Path, max_epochs: int | None) -> Case:
    import yaml

    settings = yaml.safe_load(Path(config).read_text())
    model = settings["model"]["init_args"]
    tokens = (model["image_size"] // model["patch_size"]) ** 2 + 1
    batch = settings["data"]["init_args"]["batch_size"]
    return Case("main_job", batch, tokens, {"config": str(config), "max_epochs": max_epochs})


# --- measuring ------------------------------------------------------------------------------------


class _PeakMemory:
    """Peak memory of the process above a baseline taken right before a call (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0
        if device.type == "cpu":
            if not Path("/proc/self/clear_refs").exists():
                raise RuntimeError("the bench measures CPU memory with Linux's /proc/self/clear_refs; "
                                   "run it on Linux, or on a CUDA device (--device cuda)")
            self._trim = ctypes.CDLL(None).malloc_trim

    def reset(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        self._trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # "5": reset the peak resident set size
        self.baseline = _status_kib("VmRSS")

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - self.baseline) / 2**20
        return (_status_kib("VmHWM") - self.baseline) / 1024


def _status_kib(key: str) -> int:
    return int(re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def _measure(calls: dict[str, Callable[[], object]], memory: _PeakMemory, repeats: int,
             budget: float, tick: Callable[[], object] = lambda: None) -> dict[str, tuple[float, float]]:
    """Method -> ``(median seconds, peak MiB)`` after one warm-up call of each.

    The repeats go round the methods in turn (not all repeats of one method, then the next), so a
    burst of load from elsewhere on the machine is shared among the methods rather than landing on
    one. A method leaves the rounds once its timed calls have taken ``budget`` seconds. ``tick()``
    follows each of the ``len(calls) * (1 + repeats)`` calls, made or left out, outside the timing.
    """
    for fn in calls.values():
        fn()
        tick()
    seconds: dict[str, list[float]] = {m: [] for m in calls}
    cpu: dict[str, list[float]] = {m: [] for m in calls}
    peaks: dict[str, list[float]] = {m: [] for m in calls}
    for _ in range(repeats):
        for method, fn in calls.items():
            if seconds[method] and sum(seconds[method]) > budget:
                tick()
                continue
            memory.reset()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            if memory.device.type == "cuda":
                torch.cuda.synchronize(memory.device)
            seconds[method].append(time.perf_counter() - start)
            cpu[method].append(time.process_time() - start_cpu)
            peaks[method].append(memory.peak_mb())
            tick()
    # A call that allocates nothing new still touches some pages; never report a non-positive peak.
    return {m: (statistics.median(seconds[m]), max(max(peaks[m]), 1 / 1024), statistics.median(cpu[m])) for m in calls}


# --- the model cases ------------------------------------------------------------------------------


@dataclass
class _Subject:
    """A model with one batch, and the same batch in the form Captum attributes."""

    model: nn.Module
    inputs: Any
    labels: Tensor
    captum_input: Tensor
    captum_forward: Callable[..., Tensor]
    captum_extra: tuple[Tensor, ...]
    tokens: int
    query: Any = 0


def _logits(model: nn.Module, inputs: Any) -> Tensor:
    from lightning_gae.engine.forward import model_logits

    return model_logits(model(**inputs) if isinstance(inputs, dict) else model(inputs))


def _vit(case: Case, device: torch.device) -> _Subject:
    from recipes.vit import ViT

    side = math.isqrt(case.tokens - 1)
    if side * side != case.tokens - 1:
        raise ValueError(f"a ViT case needs N = side^2 + 1 tokens; got {case.tokens}")
    patch = 4
    model = ViT(image_size=side * patch, patch_size=patch, in_chans=3, num_classes=10, mlp_ratio=4.0, dropout=0.0,
                **case.size).to(device)
    x = torch.rand(case.batch, 3, side * patch, side * patch, device=device)
    labels = torch.randint(0, 10, (case.batch,), device=device)
    return _Subject(model, x, labels, x, model, (), case.tokens)


def _bert(case: Case, device: torch.device) -> _Subject:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=8192, hidden_size=case.size["hidden"], num_hidden_layers=case.size["layers"],
        num_attention_heads=case.size["heads"], intermediate_size=4 * case.size["hidden"],
        max_position_embeddings=max(512, case.tokens), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=2, attn_implementation="sdpa",
    )
    model = BertForSequenceClassification(config).to(device)
    ids = torch.randint(1, config.vocab_size, (case.batch, case.tokens), device=device)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (case.batch,), device=device)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)

    def on_embeddings(e: Tensor, attention_mask: Tensor) -> Tensor:
        # Captum repeats the mask with the interpolated embeddings, so it is an argument, not a closure.
        return model(inputs_embeds=e, attention_mask=attention_mask).logits

    return _Subject(model, {"input_ids": ids, "attention_mask": mask}, labels, embeds, on_embeddings, (mask,), case.tokens)


def _llama(case: Case, device: torch.device) -> _Subject:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=4096, hidden_size=case.size["hidden"], num_hidden_layers=case.size["layers"],
        num_attention_heads=case.size["heads"], num_key_value_heads=case.size["kv_heads"],
        intermediate_size=4 * case.size["hidden"], max_position_embeddings=max(2048, case.tokens),
        attn_implementation="sdpa", tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(device)
    ids = torch.randint(1, config.vocab_size, (case.batch, case.tokens), device=device)
    # Captum's methods are not measured here: the embeddings stand in for their input.
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    return _Subject(model, {"input_ids": ids}, ids, embeds, model, (), case.tokens, query="last")


def gae_matrix_rows(model: nn.Module, inputs: Any, target: Tensor, query: int = 0) -> Tensor:
    """GAE in the dense matrix form: ``R = (I + Ā_L) ⋯ (I + Ā_1)`` for every sample, then row ``query``. ``[B, N]``.

    Every layer's probabilities, gradients and ``Ā`` and the ``[B, N, N]`` relevance stay alive at
    once: the memory profile of the reference implementation, batched.
    """
    from lightning_gae.engine import rules
    from lightning_gae.engine.capture import AttentionRecorder
    from lightning_gae.engine.forward import eval_mode

    with eval_mode(model), torch.enable_grad():
        with AttentionRecorder(model) as recorder:
            logits = _logits(model, inputs)
        score = logits.gather(1, target[:, None]).sum()
        records = recorder.records
        grads = torch.autograd.grad(score, [r.tensor for r in records])
        with torch.no_grad():
            abars = [rules.avg_heads(r.as_heads(), r.as_heads(g)) for r, g in zip(records, grads)]
            return rules.gae_relevance(abars)[:, query]


def _model_methods(subject: _Subject, target: Tensor) -> dict[str, Callable[[], object]]:
    from captum.attr import IntegratedGradients, Saliency

    from lightning_gae import allow_slow_attention_flow, explain
    from lightning_gae.engine.forward import eval_mode, map_tensors

    model, inputs = subject.model, subject.inputs
    batch = target.shape[0]
    extra = subject.captum_extra or None

    def forward_backward() -> None:
        model.train()
        logits = _logits(model, inputs)
        # A language model's training step: every position's next token.
        F.cross_entropy(logits.flatten(0, 1) if logits.dim() == 3 else logits, subject.labels.flatten()).backward()
        # Dropped after the step, so each repeat starts from the same memory (no gradients held).
        model.zero_grad(set_to_none=True)

    def per_sample_loop() -> list[Tensor]:
        return [gae_matrix_rows(model, map_tensors(inputs, lambda t, i=i: t[i:i + 1]), target[i:i + 1])
                for i in range(batch)]

    def saliency() -> Tensor:
        with eval_mode(model):
            x = subject.captum_input.detach().clone().requires_grad_()
            return Saliency(subject.captum_forward).attribute(x, target=target, additional_forward_args=extra)

    def attention_flow() -> Tensor:
        # Measured whatever its size: the size guard is for users, the benchmark is asked to time it.
        with allow_slow_attention_flow():
            return explain(model, inputs, target=target, method="attention_flow").tokens

    def integrated_gradients() -> Tensor:
        rows = batch * max(1, _IG_TOKENS // (batch * subject.tokens))
        with eval_mode(model):
            x = subject.captum_input.detach().clone().requires_grad_()
            return IntegratedGradients(subject.captum_forward).attribute(
                x, target=target, additional_forward_args=extra, n_steps=_IG_STEPS, internal_batch_size=rows)

    def gae_kernel(method: str) -> object:
        from lightning_gae.engine.triton_gae import available

        if method != "gae_chunks" and not available():
            raise RuntimeError(f"{method} needs Triton (CUDA builds of torch ship it): it would measure the chunks")
        before = os.environ.get("LIGHTNING_GAE_KERNEL")
        os.environ["LIGHTNING_GAE_KERNEL"] = _KERNEL_ENV[method]
        try:
            return explain(model, inputs, target=target, query=subject.query)
        finally:
            if before is None:
                del os.environ["LIGHTNING_GAE_KERNEL"]
            else:
                os.environ["LIGHTNING_GAE_KERNEL"] = before

    return {
        "forward_backward": forward_backward,
        "gae": lambda: explain(model, inputs, target=target, query=subject.query),
        "gae_triton": lambda: gae_kernel("gae_triton"),
        "gae_triton2": lambda: gae_kernel("gae_triton2"),
        "gae_chunks": lambda: gae_kernel("gae_chunks"),
        "gae_matrix": lambda: gae_matrix_rows(model, inputs, target),
        "per_sample_loop": per_sample_loop,
        "rollout": lambda: explain(model, inputs, target=target, method="rollout", query=subject.query),
        "attention_flow": attention_flow,
        "attnlrp": lambda: explain(model, inputs, target=target, method="attnlrp", query=subject.query),
        "transformer_attribution": lambda: explain(model, inputs, target=target, method="transformer_attribution"),
        "saliency": saliency,
        "integrated_gradients": integrated_gradients,
    }


def _run_model_case(case: Case, methods: Sequence[str], repeats: int, budget: float, device: torch.device,
                    tick: Callable[[], object]) -> list[dict]:
    torch.manual_seed(0)
    subject = {"bert": _bert, "llama": _llama}.get(case.name, _vit)(case, device)
    with torch.no_grad():
        subject.model.eval()
        logits = _logits(subject.model, subject.inputs)
        target = (logits[:, -1] if logits.dim() == 3 else logits).argmax(dim=-1)
    runs = _model_methods(subject, target)
    measured = _measure({m: runs[m] for m in methods}, _PeakMemory(device), repeats, budget, tick)
    return [_row(case, m, *measured[m]) for m in methods]


# --- the main job ---------------------------------------------------------------------------------


def _fit(config: str, with_callback: bool, save_dir: str, max_epochs: int | None) -> None:
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    # No progress bar: the fits of a case share the case's own bar (and are measured as they were before the configs
    # turned Lightning's bar on).
    args = ["--config", config, f"--trainer.logger.init_args.save_dir={save_dir}", "--trainer.enable_progress_bar=false"]
    if not with_callback:
        args.append("--trainer.callbacks=[]")
    if max_epochs is not None:
        args.append(f"--trainer.max_epochs={max_epochs}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        # The config's seed_everything seeds here, before the model is built: both fits start alike.
        cli = LightningCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                           save_config_callback=None, run=False, args=args)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)


def _run_main_job(case: Case, methods: Sequence[str], repeats: int, tick: Callable[[], object]) -> list[dict]:
    config, max_epochs = case.size["config"], case.size["max_epochs"]
    memory = _PeakMemory(torch.device("cpu"))
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    peaks: dict[str, list[float]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(prefix="lightning-gae-bench-") as save_dir:
        # Warm-up: imports, the dataset, TensorBoard, matplotlib, one round of the callback.
        _fit(config, True, save_dir, 3)
        tick()
        for repeat in range(repeats):
            # Alternating the order spreads a drifting machine load over both variants.
            for method in methods if repeat % 2 == 0 else methods[::-1]:
                memory.reset()
                start, start_cpu = time.perf_counter(), time.process_time()
                _fit(config, method == "fit_with_callback", save_dir, max_epochs)
                seconds[method].append(time.perf_counter() - start)
                cpu[method].append(time.process_time() - start_cpu)
                peaks[method].append(memory.peak_mb())
                tick()
    return [_row(case, m, statistics.median(seconds[m]), max(peaks[m]), statistics.median(cpu[m])) for m in methods]


def _row(case: Case, method: str, seconds: float, peak_mb: float, cpu_seconds: float) -> dict:
    return {"case": case.name, "method": method, "batch": case.batch, "tokens": case.tokens,
            "seconds": float(seconds), "peak_memory_mb": float(peak_mb), "cpu_seconds": float(cpu_seconds)}


def _worker(spec_path: str, result_path: str) -> None:
    """Entry point of the per-case process: read the case, measure it with a bar on stderr, write the rows."""
    from tqdm import tqdm

    spec = json.loads(Path(spec_path).read_text())
    case = Case(**spec["case"])
    methods, repeats = spec["methods"], spec["repeats"]
    # The main job warms up with one fit; the model cases with one call of each method.
    calls = 1 + len(methods) * repeats if case.name == "main_job" else len(methods) * (1 + repeats)
    with tqdm(total=calls, desc=spec["label"], unit="call", file=sys.stderr, dynamic_ncols=True, leave=False) as bar:
        tick = lambda: bar.update(1)  # noqa: E731
        if case.name == "main_job":
            rows = _run_main_job(case, methods, repeats, tick)
        else:
            rows = _run_model_case(case, methods, repeats, spec["budget"], torch.device(spec["device"]), tick)
    Path(result_path).write_text(json.dumps(rows))


# --- running and reporting ------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run`: ``rows`` of the cases measured before it, ``label`` of the case it stopped."""

    def __init__(self, rows: list[dict], label: str) -> None:
        super().__init__(label)
        self.rows, self.label = rows, label


def run(cases: Sequence[Case], repeats: int = 5, budget: float = 60.0, device: str = "cpu",
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> list[dict]:
    """Measure every case in its own Python process; returns the result rows (see the module doc).

    Args:
        cases: what to measure (:func:`full_cases`, :func:`quick_cases`).
        repeats: timed calls per method after the warm-up (fits per variant for ``main_job``).
        budget: a method stops repeating once its timed calls have taken this many seconds.
        device: ``"cpu"`` or a CUDA device for the model cases (the main job runs as configured).
        log: receives one line per case measured (each case's process draws its own bar on stderr meanwhile).

    Raises:
        RuntimeError: a case's process failed (its traceback is on stderr).
        Interrupted: Ctrl-C; it holds the rows of the cases measured before.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    env = dict(os.environ)
    # The worker must import this very copy of lightning_gae (and recipes), wherever it is run from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lightning-gae-bench-") as tmp:
        for i, case in enumerate(cases):
            label = f"[{i + 1}/{len(cases)}] {case.name} batch={case.batch} tokens={case.tokens}"
            spec, result = Path(tmp) / f"case{i}.json", Path(tmp) / f"result{i}.json"
            spec.write_text(json.dumps({"case": asdict(case), "methods": list(case.methods), "repeats": repeats,
                                        "budget": budget, "device": device, "label": label}))
            began = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, "-m", "benchmarks.bench", _WORKER, str(spec), str(result)], env=env,
                                      stdout=subprocess.DEVNULL, check=False)
            except KeyboardInterrupt:
                raise Interrupted(rows, label) from None
            if done.returncode in (130, -signal.SIGINT):
                raise Interrupted(rows, label)
            if done.returncode != 0:
                raise RuntimeError(f"bench case {case.name} batch={case.batch} tokens={case.tokens} failed "
                                   f"(exit code {done.returncode}); its traceback is above")
            found = json.loads(result.read_text())
            rows.extend(found)
            summary = ", ".join(f"{r['method']} {r['seconds']:.3g}s ({r['cpu_seconds']:.3g}s CPU) {r['peak_memory_mb']:.0f}MB"
                                for r in found)
            log(f"{label} in {time.perf_counter() - began:.0f}s: {summary}")
    return rows


def _lookup(rows: Sequence[dict]) -> dict[tuple[str, int, int, str], dict]:
    return {(r["case"], r["batch"], r["tokens"], r["method"]): r for r in rows}


def _settings(rows: Sequence[dict], name: str) -> list[tuple[int, int]]:
    return sorted({(r["batch"], r["tokens"]) for r in rows if r["case"] == name}, key=lambda s: (s[1], s[0]))


def ratio_report(rows: Sequence[dict]) -> str:
    """Markdown: time and peak memory of every method relative to ``forward_backward``, then the performance targets."""
    found = _lookup(rows)
    others = MODEL_METHODS[1:]
    lines = ["| case | batch | N | forward_backward | " + " | ".join(others) + " |",
             "| --- | ---: | ---: | ---: |" + " ---: |" * len(others)]
    for name in ("vit", "bert"):
        for batch, tokens in _settings(rows, name):
            floor = found[(name, batch, tokens, "forward_backward")]
            at = [found.get((name, batch, tokens, m)) for m in others]  # a method left out by --methods: "-"
            cells = [f"{r['seconds'] / floor['seconds']:.2f}x / {r['peak_memory_mb'] / floor['peak_memory_mb']:.2f}x"
                     if r else "-" for r in at]
            lines.append(f"| {name} | {batch} | {tokens} | {floor['seconds']:.3g} s / {floor['peak_memory_mb']:.0f} MB | "
                         + " | ".join(cells) + " |")
    lines += ["", "Cells: time / peak memory, each relative to forward_backward of the same row.", ""]
    lrp = [(name, *s) for name in ("vit", "bert") for s in _settings(rows, name)
           if any((name, *s, m) in found for m in LRP_BENCH_METHODS)]
    if lrp:
        lines += ["| LRP methods | batch | N | " + " | ".join(f"{m} / gae (time, memory)" for m in LRP_BENCH_METHODS)
                  + " | " + " | ".join(f"{m} / forward_backward" for m in LRP_BENCH_METHODS) + " |",
                  "| --- | ---: | ---: |" + " ---: |" * (2 * len(LRP_BENCH_METHODS))]
        for key in lrp:
            gae, floor = found[(*key, "gae")], found[(*key, "forward_backward")]
            at = [found.get((*key, m)) for m in LRP_BENCH_METHODS]
            vs_gae = [f"{r['seconds'] / gae['seconds']:.2f}x, {r['peak_memory_mb'] / gae['peak_memory_mb']:.2f}x" if r else "-" for r in at]
            vs_floor = [f"{r['seconds'] / floor['seconds']:.2f}x" if r else "-" for r in at]
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(vs_gae + vs_floor) + " |")
        lines.append("")
    kernels = {method: [(name, *st) for name in ("vit", "bert", "llama") for st in _settings(rows, name)
                        if (name, *st, method) in found] for method in KERNEL_BENCH_METHODS}
    for method, kernel in kernels.items():
        if not kernel:
            continue
        title = {"gae_triton": "the Triton kernel", "gae_chunks": "the chunks"}.get(method, "the FA2-shaped kernel")
        lines += [f"| {title} | batch | N | {method} / gae (time, memory) | {method} / forward_backward "
                  f"(time, memory) | {method} / saliency (time) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for key in kernel:
            fused, gae, floor = found[(*key, method)], found[(*key, "gae")], found[(*key, "forward_backward")]
            vs = [f"{fused['seconds'] / r['seconds']:.2f}x, {fused['peak_memory_mb'] / r['peak_memory_mb']:.2f}x"
                  for r in (gae, floor)]
            saliency = found.get((*key, "saliency"))
            vs.append("-" if saliency is None else f"{fused['seconds'] / saliency['seconds']:.2f}x")
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(vs) + " |")
        lines.append("")
    flows = _settings(rows, "flow")
    if flows:
        lines += ["| attention flow, 1 sample | N | attention_flow | attention_flow / gae | attention_flow / rollout |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for batch, tokens in flows:
            flow, gae, rollout = (found[("flow", batch, tokens, m)]["seconds"] for m in ("attention_flow", "gae", "rollout"))
            lines.append(f"| flow | {tokens} | {flow:.3g} s | {flow / gae:.1f}x | {flow / rollout:.1f}x |")
        lines.append("")

    llamas = _settings(rows, "llama")
    if llamas:
        lines += ["| decoder (Llama, last position) | batch | N | gae / forward_backward (time, memory) | "
                  "rollout / forward_backward | attnlrp / forward_backward (time, memory) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for batch, tokens in llamas:
            at = {m: found.get(("llama", batch, tokens, m)) for m in LLAMA_METHODS}
            floor = at["forward_backward"]
            cell = lambda m, at=at, floor=floor: "-" if at[m] is None else (  # noqa: E731
                f"{at[m]['seconds'] / floor['seconds']:.2f}x, {at[m]['peak_memory_mb'] / floor['peak_memory_mb']:.2f}x")
            rollout = "-" if at["rollout"] is None else f"{at['rollout']['seconds'] / floor['seconds']:.2f}x"
            lines.append(f"| llama | {batch} | {tokens} | {cell('gae')} | {rollout} | {cell('attnlrp')} |")
        lines.append("")

    targets: list[tuple[str, tuple[float, float | None], str]] = []
    vit, bert = _settings(rows, "vit"), _settings(rows, "bert")

    def ratio(key_a: tuple, key_b: tuple, measure: str = "seconds") -> float:
        return found[key_a][measure] / found[key_b][measure]

    def both(key_a: tuple, key_b: tuple, measure: str = "seconds") -> tuple[float, float | None] | None:
        """The ratio, and for times the same ratio in CPU seconds (None for memory or rows without them); None when
        a method was not measured (``--methods``)."""
        if key_a not in found or key_b not in found:
            return None
        cpu = found[key_a].get("cpu_seconds"), found[key_b].get("cpu_seconds")
        in_cpu = cpu[0] / cpu[1] if measure == "seconds" and None not in cpu and cpu[1] > 0 else None
        return ratio(key_a, key_b, measure), in_cpu

    if vit:
        # The issue names batch 64, N = 257: the largest ViT setting measured.
        b, n = max(vit, key=lambda s: (s[0], s[1]))
        at = f"vit batch {b}, N={n}"
        targets += [
            (f"gae / saliency ({at})", both(("vit", b, n, "gae"), ("vit", b, n, "saliency")), "<= 1.0"),
            (f"gae / forward_backward ({at})", both(("vit", b, n, "gae"), ("vit", b, n, "forward_backward")), "<= 1.2"),
            (f"integrated_gradients / gae ({at})", both(("vit", b, n, "integrated_gradients"), ("vit", b, n, "gae")), ">= 35"),
            (f"per_sample_loop / gae ({at})", both(("vit", b, n, "per_sample_loop"), ("vit", b, n, "gae")), ">= 3"),
        ]
        # Issue 20: one forward and one backward each (attnlrp); the gradient and the relevance (transformer_attribution).
        targets += [(f"{m} / gae ({at})", both(("vit", b, n, m), ("vit", b, n, "gae")), wanted)
                    for m, wanted in (("attnlrp", "<= 1.3"), ("transformer_attribution", "<= 2.0")) if ("vit", b, n, m) in found]
    settings = [("vit", *s) for s in vit] + [("bert", *s) for s in bert]
    if settings:
        worst = max(settings, key=lambda s: ratio((*s, "gae"), (*s, "forward_backward")))
        targets.append((f"gae / forward_backward, worst case ({worst[0]} batch {worst[1]}, N={worst[2]})",
                        both((*worst, "gae"), (*worst, "forward_backward")), "<= 1.5"))
    if bert:
        b, n = max(bert, key=lambda s: (s[1], s[0]))
        targets.append((f"peak memory gae / forward_backward (bert batch {b}, N={n})",
                        both(("bert", b, n, "gae"), ("bert", b, n, "forward_backward"), "peak_memory_mb"), "<= 1.5"))
    for b, n in llamas:
        # Issue 22: long prompts, batch 1, at every N measured.
        targets += [(f"llama gae / forward_backward (batch {b}, N={n})", both(("llama", b, n, "gae"), ("llama", b, n, "forward_backward")), "<= 1.5"),
                    (f"llama peak memory gae / forward_backward (batch {b}, N={n})",
                     both(("llama", b, n, "gae"), ("llama", b, n, "forward_backward"), "peak_memory_mb"), "<= 1.5")]
    for key in kernels["gae_triton"]:
        # Issue 24: the kernel as fast as Captum's saliency; its memory near a training step's at 8k tokens.
        at = f"{key[0]} batch {key[1]}, N={key[2]}"
        targets.append((f"gae_triton / saliency ({at})", both((*key, "gae_triton"), (*key, "saliency")), "<= 1.0"))
        if key[2] >= 8192:
            targets.append((f"peak memory gae_triton / forward_backward ({at})",
                            both((*key, "gae_triton"), (*key, "forward_backward"), "peak_memory_mb"), "<= 1.2"))
    for key in kernels["gae_triton2"]:
        # Issue 35: at most 1.05x saliency (1.10x from 4,096 tokens), 0.9x the chunks and 1.2x a step's memory at 8k.
        at = f"{key[0]} batch {key[1]}, N={key[2]}"
        targets.append((f"gae_triton2 / saliency ({at})", both((*key, "gae_triton2"), (*key, "saliency")),
                        "<= 1.10" if key[2] >= 4096 else "<= 1.05"))
        chunks = "gae_chunks" if (*key, "gae_chunks") in found else "gae"  # gae is the kernel where it is the default
        if key[2] >= 8192:
            targets += [(f"gae_triton2 / {chunks} ({at})", both((*key, "gae_triton2"), (*key, chunks)), "<= 0.9"),
                        (f"peak memory gae_triton2 / forward_backward ({at})",
                         both((*key, "gae_triton2"), (*key, "forward_backward"), "peak_memory_mb"), "<= 1.2")]
    for b, n in _settings(rows, "main_job"):
        targets.append(("main_job fit_with_callback / fit_without_callback",
                        both(("main_job", b, n, "fit_with_callback"), ("main_job", b, n, "fit_without_callback")), "<= 1.10"))
    # The same ratios in CPU seconds, which another job on the machine moves less than wall seconds (rows written
    # before the benchmark recorded them have none).
    lines += ["| target | measured | wanted | met | in CPU seconds |", "| --- | ---: | ---: | --- | ---: |"]
    for label, measured, wanted in targets:
        if measured is None:
            continue
        value, cpu = measured
        bound = float(wanted.split()[1])
        met = value <= bound if wanted.startswith("<=") else value >= bound
        cpu_cell = "-" if cpu is None else f"{cpu:.2f}"
        lines.append(f"| {label} | {value:.2f} | {wanted} | {'yes' if met else 'no'} | {cpu_cell} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m benchmarks.bench [--quick] [--output FILE.json]``: measure, print the ratio tables, optionally write
    the rows."""
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="What an explanation costs next to one training step, Captum's methods and the reference code: "
                    "median seconds and peak memory of each method on the same batches, and their ratios.")
    parser.add_argument("--quick", action="store_true", help="tiny models and a 3-epoch main job: a smoke test (minutes)")
    parser.add_argument("--output", help="write {'results': [{case, method, batch, tokens, seconds, peak_memory_mb}, ...]} here")
    parser.add_argument("--cases", nargs="+", choices=("vit", "bert", "flow", "llama", "main_job"),
                        default=["vit", "bert", "flow", "llama", "main_job"],
                        help="run only these case kinds")
    parser.add_argument("--tokens", type=int, nargs="+",
                        help="run only the settings with these token counts N (e.g. --cases llama --tokens 1024 4096)")
    parser.add_argument("--methods", nargs="*", choices=[m for m in (*MODEL_METHODS, *LRP_BENCH_METHODS, *KERNEL_BENCH_METHODS)
                                                         if m not in ("forward_backward", "gae")],
                        help="the vit, bert and llama cases measure only these besides forward_backward and gae; none "
                             "named: those two alone (e.g. --cases llama --tokens 8192 --methods, without the N^2 memory "
                             "of rollout and attnlrp)")
    parser.add_argument("--repeats", type=int, help="timed repeats after the warm-up (default 3, 1 with --quick)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="a method stops repeating once its timed calls took this many seconds (default 60)")
    parser.add_argument("--config", default=str(_MAIN_CONFIG), help="the main job's LightningCLI config")
    parser.add_argument("--device", default="cpu", help="device of the model cases (default cpu)")
    parser.add_argument("--sizes", choices=("cpu", "gpu"), default="cpu",
                        help="the model sizes: this project's CPU cases (default), or GPU sizes (ViT-B/16 at "
                             "batch 64, BERT-base at N = 512 and 4096, a Llama-style decoder at 8192 tokens)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config} does not exist; give the main job's LightningCLI YAML")
    chosen = quick_cases if args.quick else gpu_cases if args.sizes == "gpu" else full_cases
    cases = select_cases(chosen(args.config), args.cases, args.tokens, args.methods)
    if not cases:
        parser.error(f"no {' or '.join(args.cases)} case has N in {args.tokens}; the settings are listed in "
                     "benchmarks/bench.py (full_cases, quick_cases)")
    repeats = args.repeats or (1 if args.quick else 3)
    try:
        rows = run(cases, repeats=repeats, budget=args.budget, device=args.device)
    except Interrupted as stop:
        measured = len({(r["case"], r["batch"], r["tokens"]) for r in stop.rows})
        # "\r": a case's process stopped inside tqdm's first draw leaves that bar's line open; the message writes over it.
        print(f"\r{_PROG}: interrupted in {stop.label}; {measured} of {len(cases)} cases measured before it "
              f"(their lines are above); nothing was written and no table printed (they wait for every case)",
              file=sys.stderr)
        raise SystemExit(130) from None
    if args.output:
        Path(args.output).write_text(json.dumps({"results": rows}, indent=2) + "\n")
    print(ratio_report(rows))


if __name__ == "__main__":
    if sys.argv[1:2] == [_WORKER]:
        try:
            _worker(sys.argv[2], sys.argv[3])
        except KeyboardInterrupt:
            # Ctrl-C reaches every process of the terminal's group: the parent says what was measured.
            sys.exit(130)
    else:
        main()
