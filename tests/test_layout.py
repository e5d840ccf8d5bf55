"""The package's layout holds: no module reaches into another's private names, no module outgrows one job,
and the callback scores every ground truth compare scores (one table, no drifting copies)."""

import ast
import importlib
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_gae.callbacks import GAECallback
from lightning_gae.compare import compare
from lightning_gae.token_sets import GROUND_TRUTH

PACKAGE = Path(__file__).resolve().parent.parent / "lightning_gae"
# The torchmetrics split (docs/STYLE.md): a metric class file calls the _<name>_update/_<name>_compute of the
# functional file of the same name, and nothing else's privates.
_PAIRED = {f"lightning_gae.metrics.{p.stem}": f"lightning_gae.metrics.functional.{p.stem}"
           for p in (PACKAGE / "metrics" / "functional").glob("[!_]*.py")}
# Modules allowed past ~600 lines, with the one job that needs the length.
_LONG = {
    "lightning_gae/callbacks/gae_monitor.py": "one callback: its arguments, checks, hooks and schedule (a third is the "
                                              "Lightning-style docstring of every argument)",
    "lightning_gae/capture.py": "the engine's capture (ARCHITECTURE keeps the engine's files as they are)",
}

# Every public name of the package before the layout change (the __all__ of each module at 802ffac), by the import
# path users and configs name it with. lightning_gae.bench left the wheel on purpose (benchmarks/bench.py).
_PUBLIC_BEFORE = {
    "lightning_gae": ['AttentionRecord', 'AttentionRecorder', 'Explanation', 'ImageTokens', 'METHODS', 'Modality', 'Streams', 'TabularTokens', 'TextTokens', 'explain', 'metrics'],
    "lightning_gae.attn_gradcam_vit": ['attn_gradcam_vit_row'],
    "lightning_gae.attribution": ['AttentionAttribution', 'AttentionGradCAM', 'AttentionRollout', 'GenericAttention', 'RawAttention'],
    "lightning_gae.callbacks": ['GAECallback'],
    "lightning_gae.callbacks.gae_monitor": ['GAECallback', 'default_batch_ground_truth', 'default_batch_inputs', 'default_batch_labels'],
    "lightning_gae.capture": ['AttentionRecord', 'AttentionRecorder', 'explicit_multi_head_attention_forward', 'explicit_scaled_dot_product_attention'],
    "lightning_gae.compare": ['ATTRIBUTION_METHODS', 'Comparison', 'DEFAULT_METHODS', 'attribute', 'compare', 'comparison_grid', 'infer_modality', 'last_positions', 'sequence_rows', 'token_set_input', 'token_set_inputs'],
    "lightning_gae.explain": ['Explanation', 'METHODS', 'eval_mode', 'explain', 'map_tensors', 'model_logits'],
    "lightning_gae.lean": ['LeanCall', 'LeanState', 'lean_attention'],
    "lightning_gae.metrics": ['AOPC', 'AlignmentAccuracy', 'Comprehensiveness', 'DeletionAUC', 'ExplanationStability', 'InsertionAUC', 'PERTURBATION_METRICS', 'PerturbationAUC', 'RationaleAgreement', 'RelevanceSegmentation', 'Sufficiency', 'functional', 'perturbation_metric', 'random_attribution'],
    "lightning_gae.metrics.agreement": ['ExplanationStability', 'RationaleAgreement', 'RelevanceSegmentation'],
    "lightning_gae.metrics.alignment": ['AlignmentAccuracy'],
    "lightning_gae.metrics.functional": ['ERASER_BINS', 'PERTURBATION_FRACTIONS', 'PROTOCOLS', 'RISE_FRACTIONS', 'alignment_accuracy', 'aopc', 'comprehensiveness', 'deletion_auc', 'explanation_stability', 'insertion_auc', 'perturbation_auc', 'perturbation_curve', 'random_attribution', 'rationale_agreement', 'relevance_segmentation', 'sufficiency'],
    "lightning_gae.metrics.functional.alignment": ['alignment_accuracy'],
    "lightning_gae.metrics.functional.perturbation": ['ERASER_BINS', 'PERTURBATION_FRACTIONS', 'PROTOCOLS', 'RISE_FRACTIONS', 'aopc', 'comprehensiveness', 'deletion_auc', 'insertion_auc', 'perturbation_auc', 'perturbation_curve', 'perturbed_scores', 'random_attribution', 'sufficiency'],
    "lightning_gae.metrics.functional.segmentation": ['min_max', 'rationale_agreement', 'relevance_segmentation'],
    "lightning_gae.metrics.functional.stability": ['explanation_stability'],
    "lightning_gae.metrics.perturbation": ['AOPC', 'Comprehensiveness', 'DeletionAUC', 'InsertionAUC', 'NegativePerturbationAUC', 'PerturbationAUC', 'PositivePerturbationAUC', 'Sufficiency'],
    "lightning_gae.modalities": ['ImageTokens', 'Modality', 'TabularTokens', 'TextTokens'],
    "lightning_gae.rules": ['apply_mm_attention_rules', 'apply_self_attention_rules', 'apply_self_attention_rules_row', 'attn_gradcam_row', 'avg_heads', 'gae_relevance', 'gae_relevance_row', 'handle_residual', 'one_hot_rows', 'raw_attention_row', 'rollout_map', 'rollout_row', 'row_normalize', 'start_rows', 'token_set_relevance'],
    "lightning_gae.streams": ['PRESETS', 'Streams', 'TokenSets', 'assign_token_sets', 'preset_streams'],
    "lightning_gae.tensorboard": ['PLUGIN_NAME', 'RELEVANCE_SCALARS', 'SetInput', 'TensorBoardViews', 'custom_scalars_layout', 'faithfulness_table', 'sample_tag', 'scalar_tag'],
    "lightning_gae.tensorboard.plugin": ['GAEDashboardLoader', 'GAEDashboardPlugin'],
    "lightning_gae.tensorboard.summary": ['RELEVANCE_SCALARS', 'SetInput', 'TensorBoardViews', 'custom_scalars_layout', 'faithfulness_table', 'sample_tag', 'scalar_tag'],
    "lightning_gae.visualize": ['DIVERGING_CMAP', 'SEQUENTIAL_CMAP', 'colorbar', 'colorize', 'colormap_lut', 'evolution_grid', 'feature_bars', 'feature_table', 'figure_to_array', 'grid', 'heatmap_panel', 'matrix_panel', 'normalize', 'overlay', 'panel_row', 'side_by_side', 'stack', 'text_line', 'titled_image', 'token_rows', 'token_strip', 'value_range'],
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_imports(path: Path) -> list[str]:
    """``module: name`` for every private name this file takes from another of the package's modules."""
    here = _module_name(path)
    tree = ast.parse(path.read_text())
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_gae"):
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and node.module != here and _PAIRED.get(here) != node.module:
                    found.append(f"{node.module}: {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lightning_gae"):
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        # module._name through `import lightning_gae.x as m`
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{aliases[node.value.id]}: {node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    offences = {str(p.relative_to(PACKAGE.parent)): _private_imports(p) for p in sorted(PACKAGE.rglob("*.py"))}
    offences = {path: names for path, names in offences.items() if names}
    assert offences == {}


def test_the_private_import_check_catches_one(tmp_path):
    # The check itself must see an offence: the callback's old import of compare's helpers.
    fake = PACKAGE / "callbacks" / "_layout_probe.py"
    try:
        fake.write_text("from lightning_gae.compare import _take, attribute\nimport lightning_gae.explain as e\ne._call_args\n")
        assert _private_imports(fake) == ["lightning_gae.compare: _take", "lightning_gae.explain: _call_args"]
    finally:
        fake.unlink()


def test_no_module_outgrows_one_job():
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {path: n for path, n in sizes.items() if n > 650 and path not in _LONG}
    assert long == {}
    assert all(path in sizes for path in _LONG)


def test_the_wheel_has_no_upward_import_into_the_repository():
    # recipes/ and benchmarks/ are not in the wheel: the package never imports them, except the command that runs the
    # checkout's benchmark from the working directory and says what it needs outside one (test_wheel.py).
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found |= {(path.name, n) for n in names if n.split(".")[0] in ("recipes", "benchmarks", "tests")}
    assert found == {("cli.py", "benchmarks.bench")}


@pytest.mark.parametrize("module", sorted(_PUBLIC_BEFORE))
def test_public_names_keep_their_import_paths(module):
    imported = importlib.import_module(module)
    assert [name for name in _PUBLIC_BEFORE[module] if not hasattr(imported, name)] == []


def test_every_ground_truth_has_one_entry_per_modality():
    kinds = [entry.modality for entry in GROUND_TRUTH]
    assert len(set(kinds)) == len(kinds)
    assert {entry.name for entry in GROUND_TRUTH} == {"segmentation", "rationale", "feature_recovery"}


@pytest.mark.slow
def test_the_callback_scores_tabular_ground_truth_as_compare_does(tmp_path):
    # The callback collected (x, y, informative) batches and never scored them, while compare scored
    # feature_recovery_*: the two copies of the ground-truth choice had drifted apart.
    from recipes.tabular import FeatureTokens, TabularClassifier, TabularDataModule

    seed_everything(0)
    split = dict(num_train=256, num_val=64, num_columns=6, num_informative=3)
    modality = FeatureTokens(**split)
    callback = GAECallback(num_samples=8, every_n_epochs=1, methods=("gae", "rollout"), modality=modality,
                           metrics=(), metric_samples=0)
    trainer = Trainer(max_epochs=1, limit_train_batches=4, logger=TensorBoardLogger(tmp_path, name="tab"),
                      callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, accelerator="cpu", devices=1)
    model = TabularClassifier(num_features=6, dim=16, depth=2, heads=2)
    data = TabularDataModule(batch_size=32, **split)
    trainer.fit(model, datamodule=data)

    events = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    for method in ("gae", "rollout", "random"):
        for key in ("token_f1", "auprc"):
            assert f"feature_recovery_{key}/{method}" in tags, tags
    # The same samples through compare: the same values.
    x, y, informative = data.val_set.tensors
    index = torch.tensor(callback.sample_indices)
    model.eval()
    result = compare(model, x[index], target=None, methods=("gae", "rollout"), metrics=("positive_perturbation_auc",),
                     modality=modality, ground_truth=informative[index], protocol="target")
    for method in ("gae", "rollout"):
        for key in ("token_f1", "auprc"):
            logged = events.Scalars(f"feature_recovery_{key}/{method}")[-1].value
            assert logged == pytest.approx(result.methods[method][f"feature_recovery_{key}"], abs=1e-5)
