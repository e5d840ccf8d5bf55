"""The package's layout holds: folders are the layers of the data flow, no module reaches into another's private
names in any form, no import cycles, one job per module, and one ground truth table (that the callback and compare
score alike is tests/evaluation/test_pipeline.py's)."""

import ast
import importlib
import shutil
from pathlib import Path

import pytest

from lightning_gae.metrics.ground_truth import GROUND_TRUTH, RECALL, SET_TRUTH
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens
from tests.helpers import layout

PACKAGE = Path(__file__).resolve().parent.parent / "lightning_gae"
# The torchmetrics split (docs/STYLE.md): a metric class file calls the _<name>_update/_<name>_compute of the
# functional file of the same name.
_PAIRED = {f"lightning_gae.metrics.{p.stem}": f"lightning_gae.metrics.functional.{p.stem}"
           for p in (PACKAGE / "metrics" / "functional").glob("[!_]*.py")}
# The size guard is an alarm: a module past it either has one job that needs the length (listed here, with it) or
# has grown a second job to move out.
_MAX_LINES = 600
_LONG: dict[str, str] = {}

# Where every public name lives, by the import path users, configs and the docs name it with.
_PUBLIC = {
    "lightning_gae": ['AttentionRecord', 'AttentionRecorder', 'Explanation', 'ImageTokens', 'LRP_METHODS', 'METHODS',
                      'Modality', 'Streams', 'TabularTokens', 'TextTokens', 'explain', 'explain_answers',
                      'explain_generation', 'metrics'],
    "lightning_gae.attribution": ['AttentionAttribution', 'AttentionGradCAM', 'AttentionRollout', 'GenericAttention',
                                  'RawAttention'],
    "lightning_gae.callbacks": ['BatchOptions', 'DisplayOptions', 'EngineOptions', 'FaithfulnessOptions', 'GAECallback'],
    "lightning_gae.callbacks.gae_monitor": ['GAECallback', 'default_batch_ground_truth', 'default_batch_inputs',
                                            'default_batch_labels'],
    "lightning_gae.compare": ['ATTRIBUTION_METHODS', 'Comparison', 'DEFAULT_METHODS', 'attribute', 'compare',
                              'comparison_grid', 'infer_modality', 'last_positions', 'sequence_rows', 'token_set_input',
                              'token_set_inputs'],
    "lightning_gae.display": ['DIVERGING_CMAP', 'SEQUENTIAL_CMAP', 'Scale', 'colorbar', 'colorize', 'colormap_lut',
                              'evolution_grid', 'feature_bars', 'feature_table', 'figure_to_array', 'grid',
                              'heatmap_panel', 'matrix_panel', 'normalize', 'overlay', 'panel_row', 'side_by_side',
                              'stack', 'text_line', 'titled_image', 'token_rows', 'token_strip', 'value_range'],
    "lightning_gae.engine.capture": ['AttentionRecord', 'AttentionRecorder', 'explicit_multi_head_attention_forward',
                                     'explicit_scaled_dot_product_attention'],
    "lightning_gae.engine.lean": ['LeanCall', 'LeanState', 'lean_attention'],
    "lightning_gae.engine.readout": ['Explanation', 'explaining', 'hide_own', 'keep_mask', 'readout_query',
                                     'target_scores'],
    "lightning_gae.engine.rules": ['apply_mm_attention_rules', 'apply_self_attention_rules',
                                   'apply_self_attention_rules_row', 'attn_gradcam_map', 'attn_gradcam_row',
                                   'attn_gradcam_vit_row',
                                   'avg_heads', 'gae_relevance', 'gae_relevance_row', 'handle_residual', 'one_hot_rows',
                                   'raw_attention_row', 'rollout_map', 'rollout_row', 'row_normalize', 'start_rows',
                                   'token_set_relevance'],
    "lightning_gae.engine.token_sets": ['PRESETS', 'Streams', 'TokenSets', 'assign_token_sets', 'preset_streams'],
    "lightning_gae.evaluation": ['Batch', 'MetricSource', 'SetScorers', 'region_masks', 'score_batches', 'score_sets',
                                 'set_scorers', 'set_truths'],
    "lightning_gae.language": ['AnswerExplanation', 'GenerationExplanation', 'NextTokenLogits', 'answer_rows',
                               'explain_answers', 'explain_generation', 'last_positions', 'sequence_rows'],
    "lightning_gae.engine.forward": ['RecordedForward', 'recorded_forward'],
    "lightning_gae.lrp": ['LRPCapture', 'UnsupportedOperation'],
    "lightning_gae.methods": ['ALL_ZERO_DEFAULT', 'KINDS', 'Method', 'RecordedForward', 'allow_slow_attention_flow',
                              'explain', 'explain_methods', 'get_method', 'method_names', 'methods_of',
                              'random_attribution', 'register_method', 'unregister_method'],
    "lightning_gae.metrics": ['AOPC', 'AlignmentAccuracy', 'Comprehensiveness', 'DeletionAUC', 'ExplanationStability',
                              'InsertionAUC', 'PERTURBATION_METRICS', 'PerturbationAUC', 'RationaleAgreement',
                              'Registration', 'RelevanceSegmentation', 'Sufficiency', 'functional',
                              'perturbation_metric', 'random_attribution', 'register_metric'],
    "lightning_gae.metrics.agreement": ['ExplanationStability', 'RationaleAgreement', 'RelevanceSegmentation'],
    "lightning_gae.metrics.alignment": ['AlignmentAccuracy'],
    "lightning_gae.metrics.functional": ['ERASER_BINS', 'PERTURBATION_FRACTIONS', 'PROTOCOLS', 'RISE_FRACTIONS',
                                         'alignment_accuracy', 'aopc', 'comprehensiveness', 'deletion_auc',
                                         'explanation_stability', 'insertion_auc', 'perturbation_auc',
                                         'perturbation_curve', 'random_attribution', 'rationale_agreement',
                                         'relevance_segmentation', 'sufficiency'],
    "lightning_gae.metrics.functional.alignment": ['alignment_accuracy'],
    "lightning_gae.metrics.functional.perturbation": ['ERASER_BINS', 'PERTURBATION_FRACTIONS', 'PROTOCOLS',
                                                      'RISE_FRACTIONS', 'aopc', 'comprehensiveness', 'deletion_auc',
                                                      'insertion_auc', 'perturbation_auc', 'perturbation_curve',
                                                      'perturbed_scores', 'random_attribution', 'sufficiency'],
    "lightning_gae.metrics.functional.segmentation": ['min_max', 'rationale_agreement', 'relevance_segmentation'],
    "lightning_gae.metrics.functional.stability": ['explanation_stability'],
    "lightning_gae.metrics.ground_truth": ['GROUND_TRUTH', 'RECALL', 'SET_TRUTH', 'TruthScore', 'scored_truth',
                                           'truth_score'],
    "lightning_gae.metrics.regions": ['RegionRecall', 'RegionShare', 'RemovalCheck', 'held_shares', 'removal_check',
                                      'score_regions'],
    "lightning_gae.metrics.perturbation": ['AOPC', 'Comprehensiveness', 'DeletionAUC', 'InsertionAUC',
                                           'NegativePerturbationAUC', 'PerturbationAUC', 'PositivePerturbationAUC',
                                           'Sufficiency'],
    "lightning_gae.modalities": ['ImageTokens', 'MethodMap', 'Modality', 'TabularTokens', 'TextTokens', 'infer_modality',
                                 'token_set_input', 'token_set_inputs'],
    "lightning_gae.modalities.image": ['ImageTokens'],
    "lightning_gae.modalities.tabular": ['TabularTokens'],
    "lightning_gae.modalities.text": ['TextTokens'],
    "lightning_gae.modalities.tokens": ['MethodMap', 'Modality'],
    "lightning_gae.options": ['BatchOptions', 'DisplayOptions', 'EngineOptions', 'FaithfulnessOptions'],
    "lightning_gae.tensorboard": ['PLUGIN_NAME', 'RELEVANCE_SCALARS', 'SetInput', 'TensorBoardViews',
                                  'custom_scalars_layout', 'faithfulness_table', 'sample_tag', 'scalar_tag'],
    "lightning_gae.tensorboard.plugin": ['GAEDashboardLoader', 'GAEDashboardPlugin'],
    "lightning_gae.tensorboard.views": ['MAX_IMAGE_SIDE', 'SetInput', 'StepViews', 'bounded', 'markdown_cell'],
    "lightning_gae.tensorboard.summary": ['RELEVANCE_SCALARS', 'SetInput', 'TensorBoardViews', 'custom_scalars_layout',
                                          'faithfulness_table', 'sample_tag', 'scalar_tag'],
}
# The package's folders, each a layer of the data flow (tests/helpers/layout.py orders them).
_FOLDERS = {"engine", "lrp", "methods", "language", "modalities", "attribution", "metrics", "evaluation", "display",
            "tensorboard", "callbacks", "cli"}


def test_no_module_touches_another_modules_private_names():
    assert layout.private_reaches(PACKAGE, _PAIRED) == {}


def test_the_privacy_check_sees_every_form_in_a_probe_module(tmp_path):
    # A temporary copy of the package with a probe that reaches into private names each way the package once did.
    copy = tmp_path / "lightning_gae"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "engine" / "rules.py").write_text((copy / "engine" / "rules.py").read_text() + "\n\n_x = 1\n")
    (copy / "callbacks" / "probe.py").write_text(
        "import sys\n"
        "import lightning_gae.engine.forward as e\n"
        "from lightning_gae.engine import rules\n"
        "from lightning_gae.engine.rules import _x\n"
        "from lightning_gae.lrp.mode import LRPCapture\n"
        "rules._x\n"
        "e._gae_backward\n"
        "sys.modules['lightning_gae.engine.forward']\n"
        "LRPCapture(None)._note_attention\n"
        "getattr(object(), '_note_attention')\n"
    )
    found = layout.private_reaches(copy, _PAIRED)
    assert sorted(found) == ["lightning_gae.callbacks.probe"]
    assert sorted(found["lightning_gae.callbacks.probe"]) == sorted([
        "import: lightning_gae.engine.rules._x",
        "module attribute: lightning_gae.engine.rules._x",
        "module attribute: lightning_gae.engine.forward._gae_backward",
        "sys.modules: lightning_gae.engine.forward",
        "attribute of another module's object: LRPCapture(None)._note_attention",
        "getattr: _note_attention",
    ])


_OUTSIDE = ("tests", "recipes", "benchmarks")


def test_nothing_outside_the_package_imports_its_private_modules_or_names():
    found = layout.outside_reaches(PACKAGE, [PACKAGE.parent / folder for folder in _OUTSIDE])
    assert found == {}


def test_the_outside_privacy_check_sees_every_form_in_a_probe_file(tmp_path):
    copy = tmp_path / "lightning_gae"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_probe.py").write_text(
        "import importlib\n"
        "import lightning_gae.callbacks._state\n"
        "from lightning_gae.callbacks._report import summary\n"
        "from lightning_gae.callbacks import _schedule\n"
        "from lightning_gae.engine.lean import CHUNK_ELEMENTS, _reduce_to\n"
        "from lightning_gae.engine import lean\n"
        "lean._reduce_to\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(lean, '_reduce_to', None)\n"
        "importlib.import_module('lightning_gae.callbacks._token_sets')\n"
    )
    found = layout.outside_reaches(copy, [tmp_path / "tests"])
    assert sorted(found) == ["tests/test_probe.py"]
    assert sorted(found["tests/test_probe.py"]) == sorted([
        "import: lightning_gae.callbacks._state",
        "import: lightning_gae.callbacks._report",
        "import: lightning_gae.callbacks._schedule",
        "import: lightning_gae.engine.lean._reduce_to",
        "module attribute: lightning_gae.engine.lean._reduce_to",
        "monkeypatch.setattr: lightning_gae.engine.lean._reduce_to",
        "importlib.import_module: lightning_gae.callbacks._token_sets",
    ])


def test_no_import_cycles_and_none_hidden_in_functions():
    # Imports inside functions count: a lazy import must not hide a cycle either.
    assert layout.cycles(layout.imports(PACKAGE, in_functions=True)) == []
    hidden = {m: names for m, names in layout.function_imports(PACKAGE).items() if m not in layout.LAZY_IMPORTS}
    assert hidden == {}


def test_no_cycle_between_folders():
    # Folders in one layer (modalities and language, metrics and attribution) are not ordered by the layers' check.
    assert layout.cycles(layout.folders(layout.imports(PACKAGE, in_functions=True))) == []
    assert layout.cycles(layout.folders({"lightning_gae.engine.rules": {"lightning_gae.lrp.mode"},
                                         "lightning_gae.lrp.mode": {"lightning_gae.engine.capture"}})) == [
        ["lightning_gae.engine", "lightning_gae.lrp"]]


def test_the_cycle_check_sees_one(tmp_path):
    copy = tmp_path / "lightning_gae"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    rules = copy / "engine" / "rules.py"
    rules.write_text("from lightning_gae.engine.forward import recorded_forward\n" + rules.read_text())
    assert any({"lightning_gae.engine.forward", "lightning_gae.engine.rules"} <= set(c) for c in
               layout.cycles(layout.imports(copy)))
    rules.write_text(rules.read_text().replace("from lightning_gae.engine.forward import recorded_forward\n", ""))
    assert layout.cycles(layout.imports(copy, in_functions=True)) == []
    rules.write_text(rules.read_text() + "\n\ndef f():\n    from lightning_gae.engine.forward import recorded_forward\n")
    assert layout.function_imports(copy)["lightning_gae.engine.rules"] == ["lightning_gae.engine.forward"]
    assert layout.cycles(layout.imports(copy)) == []
    assert any({"lightning_gae.engine.forward", "lightning_gae.engine.rules"} <= set(c) for c in
               layout.cycles(layout.imports(copy, in_functions=True)))


def test_lower_layers_never_import_upper_ones():
    assert layout.upward_imports(layout.imports(PACKAGE)) == []
    assert layout.upward_imports({"lightning_gae.engine.rules": {"lightning_gae.callbacks.gae_monitor"}}) == [
        "lightning_gae.engine.rules -> lightning_gae.callbacks.gae_monitor"]


def test_the_folders_are_the_layers_and_one_private_module_sits_at_the_top():
    top = PACKAGE.iterdir()
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == _FOLDERS
    assert sorted(p.name for p in PACKAGE.glob("_*.py") if p.name != "__init__.py") == ["_structures.py"]
    assert sorted(p.name for p in top if p.suffix == ".py") == ["__init__.py", "_structures.py", "compare.py",
                                                                "options.py"]


def test_no_module_outgrows_one_job():
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {path: n for path, n in sizes.items() if n > _MAX_LINES and path not in _LONG}
    assert long == {}
    assert all(path in sizes for path in _LONG)


# No function runs past this many lines (its def to its last line, docstring included), except the GPU kernels: each
# Triton program is one launch.
_MAX_FUNCTION_LINES = 100
_KERNELS = ("lightning_gae/engine/triton_gae.py", "lightning_gae/engine/triton_gae_fa2.py")


def test_no_function_runs_past_100_lines():
    long = {name for name in layout.long_functions(PACKAGE, _MAX_FUNCTION_LINES) if not name.startswith(_KERNELS)}
    assert sorted(long) == []


def test_the_function_length_check_sees_a_long_method(tmp_path):
    copy = tmp_path / "lightning_gae"
    copy.mkdir()
    body = "".join(f"        x = {i}\n" for i in range(100))  # a def line and 100 lines: 101
    (copy / "probe.py").write_text(f"class A:\n    def long(self):\n{body}\n    def short(self):\n        pass\n"
                                   f"def outer():\n    def inner():\n{body}")
    assert layout.long_functions(copy, 100) == {"lightning_gae/probe.py:A.long": 101,
                                                "lightning_gae/probe.py:outer": 102,
                                                "lightning_gae/probe.py:outer.inner": 101}
    assert layout.long_functions(copy, 101) == {"lightning_gae/probe.py:outer": 102}


def test_the_wheel_has_no_upward_import_into_the_repository():
    # recipes/, benchmarks/ and tests/ are not in the wheel: the package never imports them, in any function either.
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found |= {(path.name, n) for n in names if n.split(".")[0] in ("recipes", "benchmarks", "tests")}
    assert found == set()


def test_no_code_outside_the_modalities_switches_on_a_concrete_modality():
    # A modality owns its behaviour (Modality's methods); a switch on its class elsewhere is an edit a new modality
    # would need there too.
    assert layout.modality_switches(PACKAGE) == {}


def test_the_modality_switch_check_sees_each_form_in_a_probe_module(tmp_path):
    copy = tmp_path / "lightning_gae"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "compare_probe.py").write_text(
        "from lightning_gae import modalities\n"
        "from lightning_gae.modalities import ImageTokens, TextTokens\n"
        "def f(m):\n"
        "    a = isinstance(m, ImageTokens)\n"
        "    b = isinstance(m, (modalities.TabularTokens, int))\n"
        "    c = type(m) is TextTokens\n"
        "    d = m.__class__ == ImageTokens\n"
        "    e = issubclass(type(m), TextTokens)\n"
        "    match m:\n"
        "        case TextTokens():\n"
        "            pass\n"
        "    return isinstance(m, modalities.Modality) and type(m) is int\n"
        # A table of classes, and class tests that read one: the switch moved into data.
        "TABLE = {'masks': ImageTokens, 'rows': modalities.TextTokens}\n"
        "ENTRY = dict(modality=TextTokens)\n"
        "def g(m, entry, key, modality_class, x: ImageTokens) -> TextTokens:\n"
        "    ImageTokens.infer(m, 3), TextTokens(), modalities.TabularTokens()\n"
        "    return isinstance(m, entry.modality) or issubclass(m, TABLE[key]) or isinstance(m, (int, modality_class))\n"
    )
    # The modalities themselves may: a probe there is not reported.
    (copy / "modalities" / "probe.py").write_text("from lightning_gae.modalities.image import ImageTokens\n"
                                                   "def f(m):\n    return isinstance(m, ImageTokens)\n")
    found = layout.modality_switches(copy)
    assert list(found) == ["lightning_gae.compare_probe"]
    assert [hit.split(":")[0] for hit in found["lightning_gae.compare_probe"]] == [
        "4", "5", "6", "7", "8", "10", "13", "13", "14", "17", "17", "17"]


@pytest.mark.parametrize("module", sorted(_PUBLIC))
def test_public_names_have_their_import_paths(module):
    imported = importlib.import_module(module)
    assert [name for name in _PUBLIC[module] if not hasattr(imported, name)] == []


def test_every_class_path_of_the_configs_imports():
    import yaml

    def class_paths(node):
        if isinstance(node, dict):
            if isinstance(node.get("class_path"), str):
                yield node["class_path"]
            for value in node.values():
                yield from class_paths(value)
        elif isinstance(node, list):
            for value in node:
                yield from class_paths(value)

    configs = Path(__file__).resolve().parent.parent / "configs"
    paths = {p for f in configs.glob("*.yaml") for p in class_paths(yaml.safe_load(f.read_text()))}
    assert any(p.startswith("lightning_gae.") for p in paths)
    missing = []
    for path in sorted(paths):
        module, _, name = path.rpartition(".")
        if not hasattr(importlib.import_module(module), name):
            missing.append(path)
    assert missing == []


# The tests mirror the package (tests/__init__.py): tests/<folder>/test_<name>.py tests lightning_gae/<folder>/<name>.py
# (or _<name>.py), or one of these concerns of the folder, each exercising several of its modules.
_TEST_CONCERNS = {
    "callbacks": {"answers", "failures", "faithfulness_curves", "isolation", "logging", "models", "multiprocess"},
    "lrp": {"transformer_attribution_autocast"},
    "engine": {"attn_gradcam_vit", "capture_models", "lora", "tiled_reference"},
    "metrics": {"abpc", "dtypes", "harness", "torchmetrics", "unscorable"},
    # a modality defined outside the package, run through the callback
    "modalities": {"new_modality"},
    "tensorboard": {"token_sets_tab"},
    # tests/recipes/ tests the repository's recipes/, not the package.
    "recipes": {"known_answers", "recipes", "several_token_sets"},
}


def test_the_tests_mirror_the_package():
    tests = PACKAGE.parent / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()} - {"helpers"}
    assert folders <= _FOLDERS | {"recipes"}, "a test folder is named after a package folder"
    unnamed, stale = [], []
    for folder in sorted(folders):
        source = PACKAGE.parent / "recipes" if folder == "recipes" else PACKAGE / folder
        modules = {p.stem.lstrip("_") for p in source.rglob("*.py") if p.stem != "__init__"}
        names = {p.stem.removeprefix("test_") for p in (tests / folder).glob("test_*.py")}
        unnamed += [f"tests/{folder}/test_{n}.py" for n in sorted(names - modules - _TEST_CONCERNS.get(folder, set()))]
        stale += [f"{folder}: {n}" for n in sorted(_TEST_CONCERNS.get(folder, set()) - names)]
    assert unnamed == [], "name the test module after the module it tests, or list its concern in _TEST_CONCERNS"
    assert stale == []
    assert sorted(p.name for p in tests.glob("*/*.py") if p.parent.name not in folders | {"helpers"}) == []


def test_each_modality_names_the_ground_truth_it_scores_and_the_table_holds_no_classes():
    # The table is read by the modality's ground_truth, never matched against modality classes.
    ours = {m.ground_truth for m in (ImageTokens, TextTokens, TabularTokens)}
    assert ours == set(GROUND_TRUTH) == {"segmentation", "rationale", "feature_recovery"}
    assert Modality.ground_truth is None
    assert [kind for kind, entry in GROUND_TRUTH.items() if entry.truth != kind] == []
    assert {kind for kind in SET_TRUTH.values() if kind is not None} <= set(GROUND_TRUTH)
    assert RECALL.truth in GROUND_TRUTH
    held = [value for entry in [*GROUND_TRUTH.values(), RECALL] for value in vars(entry).values()]
    assert [v for v in [*held, *SET_TRUTH.values()] if isinstance(v, type)] == []


def _handed_over(source: str) -> list[str]:
    """Where a class of ``source`` hands itself (``self``) or one of its own methods (``self.<method>``, properties
    aside) to a call, as ``"<line>: <Class>: <what>"``; the builtins that only read an attribute
    (``getattr(self, name)``) aside."""
    found = []
    for cls in (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)):
        methods = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and not any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)}
        for call in (node for node in ast.walk(cls) if isinstance(node, ast.Call)):
            if isinstance(call.func, ast.Name) and call.func.id in ("getattr", "hasattr", "isinstance"):
                continue
            for arg in [*call.args, *(keyword.value for keyword in call.keywords)]:
                arg = arg.value if isinstance(arg, ast.Starred) else arg
                if isinstance(arg, ast.Name) and arg.id == "self":
                    found.append(f"{arg.lineno}: {cls.name}: self")
                elif (isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "self"
                      and arg.attr in methods):
                    found.append(f"{arg.lineno}: {cls.name}: self.{arg.attr}")
    return found


# The callback's hooks hand their work to its Run, and neither hands itself or its methods to the modules that do
# the jobs: those are functions of data, called with data (a module that calls back into the callback is a hub).
_THIN = ("callbacks/gae_monitor.py", "callbacks/run.py")


@pytest.mark.parametrize("path", _THIN)
def test_the_callback_and_its_run_hand_no_method_of_theirs_to_a_helper(path):
    assert _handed_over((PACKAGE / path).read_text()) == []


def test_the_handed_method_check_sees_each_form_in_a_probe():
    probe = ("class Hub:\n"
             "    @property\n"
             "    def size(self):\n"
             "        return 1\n"
             "    def _explain(self, x):\n"
             "        return x\n"
             "    def step(self, helper):\n"
             "        helper(self._explain, self.size, self.value)\n"
             "        helper(self)\n"
             "        helper(explain=self._explain)\n"
             "        helper(*self.step)\n"
             "        helper(getattr(self, 'size'), self._explain(1))\n"
             "        return self._explain(1)\n")
    assert _handed_over(probe) == ["8: Hub: self._explain", "9: Hub: self", "10: Hub: self._explain",
                                   "11: Hub: self.step"]
