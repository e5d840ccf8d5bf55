"""TensorBoard views of a real run: the GAE dashboard served by a real ``tensorboard``, driven by a real Chromium,
and the standard tabs' pictures read back from the event files."""

import base64
import io
import json
import re
import time
import urllib.error
import urllib.request
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import seed_everything
from matplotlib import image as mpimg
from tensorboard.plugins.custom_scalar import layout_pb2

from lightning_gae import ImageTokens, explain, display
from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from lightning_gae.metrics import PerturbationAUC
from lightning_gae.metrics.functional.health import tied_groups
from lightning_gae.tensorboard import TensorBoardViews, custom_scalars_layout, scalar_tag
from recipes.digits import DigitsDataModule
from recipes.tensorboard_screenshots import DASHBOARD, DEEP, Chromium, find_chromium
from tests.helpers.models import small_vit
from tests.helpers.processes import get_json, tensorboard_server

METHODS = ("gae", "rollout")


@pytest.fixture(scope="module")
def run(tmp_path_factory, make_trainer):
    """A short real fit with GAECallback: 2 epochs of 4 steps, explained after each.

    Logged at Lightning's steps 3 and 7, where the epoch-end validation's own ``self.log`` lands.
    """
    root = tmp_path_factory.mktemp("tb")
    seed_everything(0)
    callback = GAECallback(num_samples=3, methods=METHODS, faithfulness=FaithfulnessOptions(samples=0))  # curves of the shown samples
    model = small_vit(dropout=0.1)
    data = DigitsDataModule(batch_size=32)
    trainer = make_trainer(root, [callback], name="runs", max_epochs=2, limit_train_batches=4, limit_val_batches=2)
    trainer.fit(model, data)
    x, y = data.val_set.tensors
    index = torch.tensor(callback.sample_indices)
    return {"logdir": Path(trainer.logger.log_dir), "callback": callback, "model": model, "x": x[index], "y": y[index]}


@pytest.fixture(scope="module")
def served(run):
    """One real ``tensorboard`` over the run for the tests that talk to it (starting one takes seconds)."""
    with tensorboard_server(run["logdir"].parent) as base:
        yield base


def test_the_plugin_is_registered_through_tensorboards_entry_point():
    found = {e.name: e.value for e in importlib_metadata.entry_points(group="tensorboard_plugins")}
    assert found.get("gae") == "lightning_gae.tensorboard.plugin:GAEDashboardLoader", (
        "the installed lightning-gae does not register its TensorBoard plugin; reinstall it: pip install -e ."
    )


@pytest.mark.slow
def test_a_real_tensorboard_serves_the_relevance_explain_gives(run, served):
    model, x, callback = run["model"], run["x"], run["callback"]
    name, base = run["logdir"].name, served
    listing = get_json(f"{base}/data/plugins_listing")
    assert listing["gae"]["enabled"] and listing["gae"]["tab_name"] == "GAE"
    assert listing["gae"]["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/gae/index.js"}
    with urllib.request.urlopen(f"{base}/data/plugin/gae/index.js") as response:
        assert "export async function render" in response.read().decode()

    plugin = f"{base}/data/plugin/gae"
    assert get_json(f"{plugin}/runs")["runs"] == [name]
    info = get_json(f"{plugin}/run?run={name}")
    assert info["steps"] == [3, 7]
    assert info["methods"] == list(METHODS)
    assert info["metrics"] == ["negative_perturbation_auc", "positive_perturbation_auc"]
    assert info["curve_steps"] == [3, 7]  # metric_samples=0: the shown samples, scored at every step
    samples = info["samples"]
    assert [s["sample"] for s in samples] == callback.sample_indices
    for sample, image, label in zip(samples, x, run["y"]):
        assert sample["modality"] == "image" and sample["grid"] == [4, 4] and sample["prefix_tokens"] == 1
        assert sample["label"] == int(label) and sample["class_names"] == [str(i) for i in range(10)]
        pixels = np.frombuffer(base64.b64decode(sample["input"]["rgb"]), dtype=np.uint8).reshape(8, 8, 3)
        expected = np.round(image[0].numpy() * 255).astype(np.uint8)
        np.testing.assert_array_equal(pixels, np.repeat(expected[..., None], 3, axis=-1))

    last = get_json(f"{plugin}/step?run={name}&step=7")
    first = get_json(f"{plugin}/step?run={name}&step=3")
    # The last explanation ran after the last training step, so explaining the final model now gives it again.
    for method in METHODS:
        exp = explain(model, x, method=method)
        for k, index in enumerate(callback.sample_indices):
            at_last = last["samples"][str(index)]["relevance"][method]
            assert at_last["space"] == "tokens"
            torch.testing.assert_close(torch.tensor(at_last["values"]), exp.tokens[k], rtol=1e-5, atol=1e-7)
            assert first["samples"][str(index)]["relevance"][method]["values"] != at_last["values"]
    with torch.no_grad():
        logits = model.eval()(x)
    probs = logits.softmax(-1)
    for k, index in enumerate(callback.sample_indices):
        prediction = last["samples"][str(index)]["prediction"]
        assert prediction["pred"] == prediction["target"] == int(logits[k].argmax())
        assert prediction["probability"] == pytest.approx(float(probs[k].max()), abs=1e-5)

    # The prediction is explained and the batches carry labels: the papers' "predicted" protocol.
    exp = explain(model, x)
    metric = PerturbationAUC(model, ImageTokens(patch_size=2), order="positive", protocol="predicted")
    metric.update(x, exp.tokens, run["y"])
    curve = last["curves"]["positive_perturbation_auc"]
    assert set(curve) == {*METHODS, "random"}
    np.testing.assert_allclose(curve["gae"]["fractions"], metric.fractions)
    np.testing.assert_allclose(curve["gae"]["values"], metric.curve().numpy(), atol=1e-6)

    with pytest.raises(urllib.error.HTTPError) as missing:
        get_json(f"{plugin}/step?run={name}&step=5")
    assert missing.value.code == 404 and "no GAE dashboard data at step 5" in missing.value.read().decode()


@pytest.mark.slow
def test_the_summary_ranks_the_methods_on_the_scalars_the_callback_logged(run, served, read_events):
    acc, name = read_events(run["logdir"]), run["logdir"].name
    info = get_json(f"{served}/data/plugin/gae/run?run={name}")
    summary = {entry["metric"]: entry for entry in info["summary"]}
    # Faithfulness only: the relevance statistics (concentration, stability) rank nothing.
    assert set(summary) == {"negative_perturbation_auc", "positive_perturbation_auc"}
    assert summary["positive_perturbation_auc"]["higher_is_better"] is False
    assert summary["negative_perturbation_auc"]["higher_is_better"] is True
    for metric, entry in summary.items():
        assert entry["steps"] == [3, 7]
        assert set(entry["methods"]) == {*METHODS, "random"}
        for method, served_values in entry["methods"].items():
            logged = acc.Scalars(f"{metric}/{method}")
            errors = acc.Scalars(f"{metric}/{method}/stderr")
            assert [e.step for e in logged] == entry["steps"]
            np.testing.assert_allclose(served_values["values"], [e.value for e in logged], rtol=1e-6)
            np.testing.assert_allclose(served_values["stderr"], [e.value for e in errors], rtol=1e-6)
        for j in range(len(entry["steps"])):
            at = {m: v["values"][j] for m, v in entry["methods"].items()}
            best_first = sorted(at, key=at.get, reverse=entry["higher_is_better"])
            ranks = [entry["methods"][m]["ranks"][j] for m in best_first]
            assert ranks == sorted(ranks) and ranks[0] == 1
            # Methods the standard errors do not tell apart share a rank and say so.
            groups = tied_groups(at, {m: v["stderr"][j] for m, v in entry["methods"].items()}, entry["higher_is_better"])
            for k, group in enumerate(groups, 1):
                assert all(entry["methods"][m]["ranks"][j] == k for m in group)
                assert all(entry["methods"][m]["tied"][j] == (len(group) > 1) for m in group)
        last = {m: v["values"][-1] for m, v in entry["methods"].items()}
        assert entry["ranking"] == sorted(last, key=last.get, reverse=entry["higher_is_better"])


def _table_ties(acc):
    """Step -> the tie note of the Text tab's faithfulness table at that step (what the run's summary prints)."""
    out = {}
    for event in acc.Tensors("gae_faithfulness"):
        table = event.tensor_proto.string_val[0].decode()
        notes = [line.removeprefix("ties: ") for line in table.splitlines() if line.startswith("ties: ")]
        if notes:
            out[event.step] = notes[0]
    return out


def test_the_summary_says_why_the_methods_tie_as_the_text_tab_does(run, served, read_events):
    # Three tracked samples scored: nothing tells the methods apart, and the note says why, at every step scored.
    info = get_json(f"{served}/data/plugin/gae/run?run={run['logdir'].name}")
    ties = _table_ties(read_events(run["logdir"]))
    assert set(ties) == {3, 7}
    assert info["ties"] == [{"step": step, "text": note} for step, note in sorted(ties.items())]
    assert all("the model" in note and "3 " in note for note in ties.values())


def _heatmap_colours(page, table):
    """Per heatmap canvas of the tab, how many of its pixels have a colour that is not in ``table``."""
    return page.evaluate(f"""(() => {{
        const bar = new Set({json.dumps(table)}.map((c) => c.join(",")));
        return [...{DASHBOARD}.querySelectorAll('canvas.gae-heatmap')].map((canvas) => {{
            const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let off = 0;
            for (let i = 0; i < data.length; i += 4) if (!bar.has(`${{data[i]}},${{data[i + 1]}},${{data[i + 2]}}`)) off++;
            return off;
        }});
    }})()""")


def _bar_labels(page, sample):
    """The colour bar's end labels under each method's heatmap of ``sample``."""
    return page.evaluate(f"""Object.fromEntries([...{DASHBOARD}.querySelectorAll('canvas.gae-heatmap[data-sample="{sample}"]')]
        .map((c) => [c.dataset.method, [...c.parentElement.querySelectorAll('.gae-bar span')].map((s) => s.textContent)]))""")


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_chromium_shows_the_summary_first_and_one_colour_scale_read_off_the_bar(run, served):
    name = run["logdir"].name
    info = get_json(f"{served}/data/plugin/gae/run?run={name}")
    step = get_json(f"{served}/data/plugin/gae/step?run={name}&step=7")
    inferno = get_json(f"{served}/data/plugin/gae/colormaps")["sequential"]["inferno"]
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        page = browser.open(f"{served}/#gae")
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
        # The summary, then the curves, then the samples, in the page's order; the summary is in the first screen.
        order = page.evaluate(f"""(() => {{
            const d = {DASHBOARD};
            const [summary, curves, samples] = ['#gae-summary', '.gae-curves', '#gae-samples'].map((s) => d.querySelector(s));
            const after = (a, b) => Boolean(a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING);
            return [after(summary, curves), after(curves, samples), summary.getBoundingClientRect().top];
        }})()""")
        assert order[:2] == [True, True] and order[2] < 900
        # The flags (here: methods not shown better than random on 3 samples) are listed above the summary.
        shown = page.evaluate(f"""[...{DASHBOARD}.querySelectorAll('#gae-flags > li')].map((li) => [li.dataset.method,
            li.dataset.cause, li.querySelector('b').textContent])""")
        assert shown == [[f["method"], f["cause"], f["text"].split("\n")[0].strip("*")] for f in info["flags"]]
        for entry in info["summary"]:
            rows = page.evaluate(f"""[...{DASHBOARD}.querySelectorAll('table.gae-ranking[data-metric="{entry['metric']}"] tr[data-method]')]
                .map((tr) => [...tr.children].map((td) => td.textContent))""")
            # A method flagged as not faithful carries a mark beside its name.
            flagged = {f["method"] for f in info["flags"]}
            assert [r[1].removesuffix(" ⚠") for r in rows] == entry["ranking"]
            assert [r[1].endswith(" ⚠") for r in rows] == [m in flagged for m in entry["ranking"]]
            tied = lambda m, j, entry=entry: "=" if entry["methods"][m]["tied"][j] else ""  # noqa: E731
            assert [r[0] for r in rows] == [f"{entry['methods'][m]['ranks'][-1]}{tied(m, -1)}" for m in entry["ranking"]]
            best = entry["methods"][entry["ranking"][0]]
            value, error = (float(v) for v in rows[0][2].split(" ± "))
            assert value == pytest.approx(best["values"][-1], rel=5e-3) and error == pytest.approx(best["stderr"][-1], rel=5e-3)
            assert [r[3:] for r in rows] == [[f"#{k}{tied(m, j)}" for j, k in enumerate(entry["methods"][m]["ranks"])]
                                             for m in entry["ranking"]]

        # Why the methods tie at the last step, under the tables it explains.
        tie = page.evaluate(f"{DASHBOARD}.querySelector('#gae-ties').textContent")
        assert tie == f"Ties at step 7: {info['ties'][-1]['text']}" and info["ties"][-1]["step"] == 7
        assert page.evaluate(f"""(() => {{ const d = {DASHBOARD};
            return Boolean(d.querySelector('#gae-summary').compareDocumentPosition(d.querySelector('#gae-ties'))
                           & Node.DOCUMENT_POSITION_FOLLOWING); }})()""")

        # By default each map spans its own largest magnitude, as the Images tab's pictures do (heatmap_scale="per_map").
        first = str(info["samples"][0]["sample"])
        per_map = _bar_labels(page, first)
        assert set(per_map) == set(METHODS) and per_map["gae"] != per_map["rollout"]
        for method in METHODS:
            patches = step["samples"][first]["relevance"][method]["values"][1:]
            assert float(per_map[method][-1]) == pytest.approx(max(patches), rel=5e-3)
        # Every heatmap pixel is a colour of the bar (no blend with the input at the default opacity).
        assert _heatmap_colours(page, inferno) == [0] * (3 * len(METHODS))

        # "shared": one colour scale per sample, its top the largest patch value of either map.
        page.evaluate(f"(() => {{ const s = {DASHBOARD}.querySelector('#gae-scale'); s.value = 'shared'; "
                      "s.dispatchEvent(new Event('change')); })()")
        page.wait_for(f"[...{DASHBOARD}.querySelectorAll('.gae-section')].some((s) => s.textContent.includes('shared by every'))")
        bars = _bar_labels(page, first)
        assert len({tuple(b) for b in bars.values()}) == 1
        patches = [v for m in METHODS for v in step["samples"][first]["relevance"][m]["values"][1:]]
        assert float(bars["gae"][-1]) == pytest.approx(max(abs(v) for v in patches), rel=5e-3)
        assert page.script_errors() == []


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_chromium_shows_the_gae_tab_and_the_step_slider_replays_training(run, served):
    heatmap = f"{DASHBOARD}.querySelector('canvas.gae-heatmap[data-method=gae]')"
    rendered = f"{DASHBOARD}.querySelector('#gae-dashboard').dataset.renderedStep"
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        page = browser.open(f"{served}/#gae")
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
        assert page.evaluate(rendered) == "7", "the dashboard opens at the last step"
        assert page.evaluate(f"{DASHBOARD}.querySelectorAll('canvas.gae-heatmap').length") == 3 * len(METHODS)
        assert page.evaluate(f"{DASHBOARD}.querySelectorAll('svg.gae-curve').length") == 2
        last_pixels = page.evaluate(f"{heatmap}.toDataURL()")

        # Hover the patch in row 1, column 2 of the first sample's GAE map: the tooltip reads its value.
        box = page.evaluate(f"""(() => {{
            {heatmap}.scrollIntoView({{block: 'center'}});
            const frame = document.querySelector('iframe').getBoundingClientRect();
            const r = {heatmap}.getBoundingClientRect();
            return [frame.left + r.left, frame.top + r.top, r.width, r.height];
        }})()""")
        left, top, width, height = box
        page.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": left + width * 2.5 / 4, "y": top + height * 1.5 / 4})
        tip = page.wait_for(f"{DASHBOARD}.querySelector('#gae-tooltip').style.display === 'block' && "
                            f"{DASHBOARD}.querySelector('#gae-tooltip').textContent")
        exp = explain(run["model"], run["x"])
        assert tip.startswith("gae · patch (1, 2): ")
        assert float(tip.rsplit(": ", 1)[1]) == pytest.approx(float(exp.tokens[0, 1 + 1 * 4 + 2]), rel=5e-3)

        page.evaluate(f"{DASHBOARD}.querySelector('#gae-step').focus()")
        page.press("ArrowLeft", 37)
        page.wait_for(f"{rendered} === '3'")
        assert page.evaluate(f"{DASHBOARD}.querySelector('#gae-step-label').textContent") == "step 3 (1 of 2)"
        assert page.evaluate(f"{heatmap}.toDataURL()") != last_pixels, "moving the slider must redraw the heatmap"
        assert page.script_errors() == []


def _rgb(colour):
    """``"#0077bb"`` or ``"rgb(0, 119, 187)"`` as ``(0, 119, 187)``."""
    if colour.startswith("#"):
        return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return tuple(int(v) for v in re.findall(r"\d+", colour)[:3])


# Every multi-line Custom Scalars card: its title, its list of matches (name, colour) and the colours of its lines.
_CUSTOM_SCALAR_CARDS = """(() => {
  const cards = [];
  const seek = (root) => { for (const n of root.querySelectorAll('*')) {
    if (n.tagName.toLowerCase() === 'tf-custom-scalar-multi-line-chart-card') cards.push(n);
    if (n.shadowRoot) seek(n.shadowRoot); } };
  seek(document);
  return cards.map((card) => {
    const root = card.shadowRoot || card;
    const lines = [];
    const paths = (r) => { for (const n of r.querySelectorAll('*')) {
      const stroke = n.tagName === 'path' && n.getAttribute('class') === 'line' && (n.style.stroke || n.getAttribute('stroke'));
      if (stroke) lines.push(stroke);
      if (n.shadowRoot) paths(n.shadowRoot); } };
    paths(root);
    return {title: card.title, lines,
            matches: [...root.querySelectorAll('.match-list-entry')].map((e) => [e.textContent.trim(), e.style.color])};
  });
})()"""


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_chromium_draws_each_method_in_its_own_colour_with_a_legend(run, served):
    methods = (*METHODS, "random")
    with Chromium(find_chromium(), width=1400, height=1000) as browser:
        page = browser.open(f"{served}/#custom_scalars")
        page.wait_for(f"{DEEP}('tf-custom-scalar-multi-line-chart-card')", timeout=120)
        metrics, cards = ("positive_perturbation_auc", "negative_perturbation_auc"), {}
        deadline = time.monotonic() + 60
        # The charts draw once TensorBoard has answered each run's request: wait for every method's line.
        while time.monotonic() < deadline and not all(len(cards.get(m, {}).get("lines", [])) >= len(methods) for m in metrics):
            cards = {c["title"]: c for c in page.evaluate(_CUSTOM_SCALAR_CARDS)}
            time.sleep(0.5)
        for metric in metrics:
            card = cards[metric]
            # The list of matches is the chart's legend: one series per method, named by the method's run.
            named = {text.rsplit("/", 1)[-1].rstrip(")"): _rgb(colour) for text, colour in card["matches"]}
            assert set(named) == set(methods), card["matches"]
            assert len(set(named.values())) == len(methods), "one colour per method"
            assert {_rgb(c) for c in card["lines"]} == set(named.values()), "the lines are drawn in the legend's colours"
        assert page.script_errors() == []

        # The GAE tab's chart over training: a line per method in its colour, and the legend beside it.
        page = browser.open(f"{served}/#gae")
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
        chart = f"{DASHBOARD}.querySelector('svg.gae-history[data-metric=positive_perturbation_auc]')"
        lines = page.evaluate(f"Object.fromEntries([...{chart}.querySelectorAll('polyline')].map((l) => [l.dataset.method, l.getAttribute('stroke')]))")
        legend = page.evaluate(f"[...{chart}.querySelectorAll('text[data-legend]')].map((t) => [t.dataset.legend, t.previousSibling.getAttribute('stroke')])")
        assert set(lines) == set(methods) and len(set(lines.values())) == len(methods)
        assert dict(legend) == lines
        # Every point of every method is inside the chart (its axis spans every value and standard error).
        inside = page.evaluate(f"""(() => {{ const box = {chart}.getBBox(); const h = {chart}.height.baseVal.value;
            return [...{chart}.querySelectorAll('circle')].map((c) => [Number(c.getAttribute('cy')), h]); }})()""")
        assert len(inside) == len(methods) * 2 and all(24 <= y <= h - 40 for y, h in inside)
        assert page.script_errors() == []


# --- the standard tabs, read back from the event file -----------------------------------------------------


def _png(event):
    return (mpimg.imread(io.BytesIO(event.encoded_image_string), format="png")[..., :3] * 255 + 0.5).astype(np.uint8)


def _find(picture, part):
    """Top-left corners where ``part`` occurs in ``picture`` exactly."""
    (h, w), (height, width) = part.shape[:2], picture.shape[:2]
    candidates = np.ones((height - h + 1, width - w + 1), dtype=bool)
    for dr in {0, h // 3, h // 2, h - 1}:
        for dc in {0, w // 4, w // 2, 3 * w // 4, w - 1}:
            candidates &= (picture[dr : dr + height - h + 1, dc : dc + width - w + 1] == part[dr, dc]).all(-1)
    return [(r, c) for r, c in np.argwhere(candidates) if np.array_equal(picture[r : r + h, c : c + w], part)]


def _ink_bands(rows_with_ink):
    """Runs of consecutive True rows: the text lines."""
    bands, start = [], None
    for i, inked in enumerate([*rows_with_ink, False]):
        if inked and start is None:
            start = i
        elif not inked and start is not None:
            bands.append((start, i))
            start = None
    return bands


@pytest.mark.slow
def test_each_tracked_sample_is_one_picture_of_every_method_at_a_readable_size(run, read_events):
    acc = read_events(run["logdir"])
    callback = run["callback"]
    line_h = display.text_line("Xg").shape[0]
    for sample, image in zip(callback.sample_indices, run["x"]):
        events = acc.Images(f"gae_heatmaps/val_{sample}")
        assert [e.step for e in events] == [3, 7]
        picture = _png(events[-1])
        # The input panel is the digit enlarged to 256 px, pixel for pixel.
        panel = display.enlarge(ImageTokens(patch_size=2).display_image(image).numpy(), 256)
        (top, left), = _find(picture, panel)
        assert panel.shape[:2] == (256, 256)
        # Above the panels: the header line and one title line, nothing more.
        bands = _ink_bands((picture[:top] < 200).any(-1).any(-1))
        assert len(bands) == 2 and all(b - a <= line_h for a, b in bands)
        # Input and every method side by side: three 256 px panels wide, each map over its colorbar.
        assert picture.shape[1] >= 3 * 256
        ramp = display.colorize(np.linspace(0, 1, 256), 0, 1, display.SEQUENTIAL_CMAP)
        assert len(_find(picture, ramp[None])) >= len(METHODS) * 10, "every map needs its colorbar"
        # The heatmaps are opaque: every pixel that is not grey (input, text, background) is a colour of the bar.
        bar = {tuple(c) for c in display.colorize(np.linspace(0, 1, 4096), 0, 1, display.SEQUENTIAL_CMAP)}
        coloured = picture[(picture != picture[..., :1]).any(-1)]
        assert len(coloured) > 3 * 256 * 256 // 2 and {tuple(c) for c in coloured} <= bar
    # Two explanation steps, fewer than evolution_length: each sample's strip is written once, at the last step.
    assert all([e.step for e in acc.Images(f"gae_evolution/val_{s}")] == [7] for s in callback.sample_indices)
    strips = [_png(acc.Images(f"gae_evolution/val_{s}")[0]) for s in callback.sample_indices]
    assert len({s.shape for s in strips}) == 1 and not np.array_equal(strips[0], strips[1])


@pytest.mark.slow
def test_scalars_are_grouped_by_metric_and_charted_together(run, read_events):
    acc = read_events(run["logdir"])
    scalars = acc.Tags()["scalars"]
    for metric in ("positive_perturbation_auc", "negative_perturbation_auc"):
        assert {scalar_tag(metric, m) for m in (*METHODS, "random")} <= set(scalars)
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    expected = custom_scalars_layout(["positive_perturbation_auc", "negative_perturbation_auc", "relevance_concentration",
                                      "relevance_stability_spearman", "relevance_stability_topk_overlap"])
    assert charts == {chart: spec[1] for category in expected.values() for chart, spec in category.items()}
    # The charts' series are the methods' own runs (tests/callbacks/test_faithfulness_curves.py), so that each is a colour.
    pattern = re.compile(charts["positive_perturbation_auc"][0])
    assert not [t for t in scalars if pattern.search(t)]
    for method in (*METHODS, "random"):
        assert [t for t in read_events(run["logdir"] / "methods" / method).Tags()["scalars"] if pattern.search(t)] == [
            "gae_faithfulness/positive_perturbation_auc"]


@pytest.mark.slow
def test_the_dashboard_tensors_name_the_plugin(run, read_plugin_events):
    acc = read_plugin_events(run["logdir"])
    ours = [t for t in acc.Tags()["tensors"] if t.startswith("gae_dashboard/")]
    assert ours and all(acc.SummaryMetadata(t).plugin_data.plugin_name == "gae" for t in ours)
    described = [json.loads(acc.SummaryMetadata(t).plugin_data.content) for t in ours]
    # A flag too where a method was not shown better than random on the 3 samples scored, and why the methods tie.
    assert {"input", "prediction", "relevance", "curve", "score"} <= {d["kind"] for d in described} <= {
        "input", "prediction", "relevance", "curve", "score", "flag", "tie"}


def test_token_relevance_that_does_not_fit_the_patch_grid_is_an_error():
    # 16 patch tokens + CLS of 8x8 digits with patch_size=2; patch_size=4 means a 2x2 grid, of which
    # 16 tokens are a multiple: a reshape alone would draw four maps per sample, the wrong ones.
    x = torch.rand(2, 1, 8, 8)
    exp = explain(small_vit(), x)
    views = TensorBoardViews()
    with pytest.raises(ValueError, match=r"17 tokens do not fit ImageTokens\(patch_size=4, prefix_tokens=1\) on 8x8 "
                                         r"images \(1 \+ 2x2 patches\)"):
        views.write([], 0, modality=ImageTokens(patch_size=4), inputs=x, shown=x, sample_indices=[0, 1],
                    explanations={"gae": exp})


@pytest.mark.slow
def test_a_second_trainer_logging_elsewhere_gets_the_inputs_and_the_layout(run, tmp_path, make_trainer,
                                                                           read_plugin_events):
    # The same callback, then trainer.validate() on a new Trainer with its own log dir: its run must
    # hold the input tensors the GAE tab draws under, and the Custom Scalars layout, too.
    trainer = make_trainer(tmp_path, [run["callback"]], name="again", limit_val_batches=2)
    trainer.validate(run["model"], DigitsDataModule(batch_size=32))
    acc = read_plugin_events(trainer.logger.log_dir)
    kinds = {json.loads(acc.SummaryMetadata(t).plugin_data.content)["kind"] for t in acc.Tags()["tensors"]
             if t.startswith("gae_dashboard/")}
    assert {"input", "relevance"} <= kinds
    inputs = [t for t in acc.Tags()["tensors"] if t.startswith("gae_dashboard/input/")]
    assert len(inputs) == len(run["callback"].sample_indices)
    assert "custom_scalars__config__" in acc.Tags()["tensors"]


def test_multi_hot_labels_are_named_in_the_titles_and_the_dashboard(tmp_path, read_plugin_events):
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    x = torch.rand(2, 1, 8, 8)
    exp = explain(small_vit(), x)
    labels = torch.tensor([[0, 1, 0, 1], [0, 0, 0, 0]])
    writer = SummaryWriter(str(tmp_path))
    TensorBoardViews().write([writer], 0, modality=ImageTokens(patch_size=2), inputs=x, shown=x, sample_indices=[5, 6],
                             explanations={"gae": exp}, labels=labels, class_names=["a", "b", "c", "d"])
    writer.close()
    acc = read_plugin_events(tmp_path)
    described = {t: json.loads(acc.SummaryMetadata(t).plugin_data.content) for t in acc.Tags()["tensors"]
                 if t.startswith("gae_dashboard/input/")}
    assert sorted(d["label"] for d in described.values()) == [[], [1, 3]]
    views = TensorBoardViews()
    assert "labels 1 (b), 3 (d)" in views.header(5, [1, 3], np.array([1.0, 1.0, 0.9]), ["a", "b", "c", "d"])
    assert "labels none" in views.header(6, [], np.array([0.0, 0.0, 0.9]), ["a", "b", "c", "d"])


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_a_map_that_is_zero_everywhere_says_why_instead_of_a_black_panel(tmp_path, make_trainer):
    from lightning_gae.methods import get_method

    seed_everything(0)
    model = small_vit()
    # A classifier head frozen at zero: every logit is 0 whatever the input, so no gradient reaches the attention and
    # Attention Grad-CAM's (mean gradient x attention)+ is zero everywhere; raw attention is not.
    head = model.model.head
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    head.requires_grad_(False)
    callback = GAECallback(num_samples=2, methods=("raw_attention", "attn_gradcam"),
                           faithfulness=FaithfulnessOptions(metrics=(), random_baseline=False))
    trainer = make_trainer(tmp_path, [callback], name="zero", max_epochs=1)
    trainer.fit(model, DigitsDataModule(batch_size=32))
    logdir = Path(trainer.logger.log_dir)
    with tensorboard_server(logdir.parent) as base:
        info = get_json(f"{base}/data/plugin/gae/run?run={logdir.name}")
        at = get_json(f"{base}/data/plugin/gae/step?run={logdir.name}&step={info['steps'][-1]}")
        for index in callback.sample_indices:
            relevance = at["samples"][str(index)]["relevance"]
            assert not any(relevance["attn_gradcam"]["values"])
            assert relevance["attn_gradcam"]["all_zero"] == get_method("attn_gradcam").all_zero
            assert "all_zero" not in relevance["raw_attention"]
        with Chromium(find_chromium(), width=1200, height=900) as browser:
            page = browser.open(f"{base}/#gae")
            page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
            boxes = page.evaluate(f"[...{DASHBOARD}.querySelectorAll('.gae-empty[data-method=attn_gradcam]')]"
                                  ".map((box) => box.textContent)")
            assert boxes == [get_method("attn_gradcam").all_zero] * 2
            assert page.evaluate(f"{DASHBOARD}.querySelectorAll('canvas.gae-heatmap[data-method=attn_gradcam]').length") == 0
            assert page.evaluate(f"{DASHBOARD}.querySelectorAll('canvas.gae-heatmap[data-method=raw_attention]').length") == 2
            assert page.script_errors() == []


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_chromium_says_what_to_do_on_a_logdir_without_a_run(tmp_path):
    logdir = tmp_path / "no_run_yet"
    logdir.mkdir()
    with tensorboard_server(logdir) as base, Chromium(find_chromium(), width=1200, height=900) as browser:
        page = browser.open(f"{base}/#gae")
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
        assert page.evaluate(f"{DASHBOARD}.querySelector('#gae-dashboard').dataset.renderedStep") == "none"
        # What a user reads: innerText is the rendered text (empty for a hidden element), on a box of some size.
        shown = page.evaluate(f"""(() => {{
            const box = {DASHBOARD}.querySelector('#gae-no-run');
            const r = box.getBoundingClientRect();
            return [box.innerText, r.width, r.height];
        }})()""")
        text, width, height = shown
        assert text == ("No run with GAE data in this logdir yet: train with lightning_gae.callbacks.GAECallback and a "
                        "TensorBoardLogger writing under this logdir. A run that is still training appears here at its "
                        "first explanation step or score (the tab checks every 15 s).")
        assert width > 200 and height > 10
        assert page.evaluate(f"{DASHBOARD}.querySelectorAll('canvas.gae-heatmap, svg.gae-curve').length") == 0
        # Without a run the controls (run, step, colormap, opacity, colour scale) and the hover hint mean nothing:
        # none of them is on screen (an element that is not rendered has no client rects).
        visible = page.evaluate(f"""(() => {{
            const doc = {DASHBOARD};
            const parts = [...doc.querySelectorAll('.gae-controls, .gae-controls select, .gae-controls input')];
            const hints = [...doc.querySelectorAll('.gae-hint')].filter((h) => h.textContent.includes('Hover a patch'));
            return [parts.length, hints.length, [...parts, ...hints].filter((e) => e.getClientRects().length).length,
                    doc.body.innerText];
        }})()""")
        parts, hints, shown_parts, page_text = visible
        assert parts == 6 and hints == 1, "the test no longer finds the controls or the hint it checks are hidden"
        assert shown_parts == 0, "the controls or the hover hint are on screen on a logdir without a run"
        assert "Hover a patch" not in page_text and "colormap" not in page_text
        # A run arrives while the tab is open: it is drawn, and the controls and the hint come with it.
        _dashboard_run(logdir / "arrived", steps=(2,)).close()
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard').dataset.renderedStep === '2'", timeout=60)
        assert page.evaluate(f"{DASHBOARD}.querySelector('#gae-run').getClientRects().length") > 0
        assert "Hover a patch" in page.evaluate(f"{DASHBOARD}.body.innerText")
        assert page.script_errors() == []


# --- declared regions: their shares beside the faithfulness curves, the alerts marked --------------------------------


@pytest.fixture(scope="module")
def region_run(tmp_path_factory, make_trainer):
    """A short fit of the shortcut text recipe, its spurious word declared with a threshold that every method crosses
    (the alerts are what is shown, not whether the model learnt the word)."""
    from lightning_gae.callbacks import RegionOptions
    from recipes.shortcuts import SpuriousReviewsDataModule
    from recipes.text_rationales import ReviewClassifier, ReviewTokens

    root = tmp_path_factory.mktemp("regions")
    seed_everything(0)
    data = SpuriousReviewsDataModule(num_train=128, num_val=64, max_length=32, batch_size=32, seed=0)
    callback = GAECallback(num_samples=6, methods=METHODS, modality=ReviewTokens(),
                           faithfulness=FaithfulnessOptions(samples=0),
                           regions=RegionOptions(regions=[data.region], threshold=0.01))
    model = ReviewClassifier(max_length=32, dim=32, depth=2, heads=2)
    with pytest.warns(UserWarning, match="suspect region 'spurious_word'"):
        trainer = make_trainer(root, [callback], name="regions", max_epochs=2, limit_train_batches=2, limit_val_batches=1)
        trainer.fit(model, data)
    return {"logdir": Path(trainer.logger.log_dir), "callback": callback}


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_the_gae_tab_charts_each_regions_shares_beside_the_curves_with_the_alerts(region_run, read_events):
    logdir = region_run["logdir"]
    logged = read_events(logdir).scalar_events("region_")
    with tensorboard_server(logdir.parent) as base:
        info = get_json(f"{base}/data/plugin/gae/run?run={logdir.name}")
        # Served: per region and stat, every method's logged value at every step, random (the floor) last.
        (region,) = info["regions"]
        assert region["region"] == "spurious_word"
        for stat in ("share", "recall"):
            entry = region[stat]
            assert list(entry["methods"]) == [*METHODS, "random"]
            for method, values in entry["methods"].items():
                points = logged[f"region_{stat}_spurious_word/{method}"]
                assert entry["steps"] == [s for s, _ in points]
                assert values == pytest.approx([v for _, v in points], abs=1e-6)
        # The alerts the callback raised (once per method), with the markdown of the Text tab's gae_alerts.
        raised = region_run["callback"].run.alerts
        assert [(a["step"], a["region"], a["method"]) for a in info["alerts"]] == [(a.step, a.region, a.method) for a in raised]
        assert [a["text"] for a in info["alerts"]] == [a.markdown() for a in raised]
        assert {a.method for a in raised} == set(METHODS)

        with Chromium(find_chromium(), width=1200, height=900) as browser:
            page = browser.open(f"{base}/#gae")
            page.wait_for(f"{DASHBOARD}.querySelector('#gae-regions svg[data-region=spurious_word]')")
            drawn = page.evaluate(f"""(() => {{
                const d = {DASHBOARD};
                const chart = d.querySelector('#gae-regions svg[data-region=spurious_word]');
                const after = (a, b) => Boolean(a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING);
                return {{
                    lines: [...chart.querySelectorAll('polyline')].map((p) => [p.dataset.method, p.getAttribute('stroke-dasharray')]),
                    dots: [...chart.querySelectorAll('circle')].map((c) => [c.dataset.method, Number(c.dataset.step)]),
                    marks: [...chart.querySelectorAll('line.gae-alert-mark')].map((l) => [Number(l.dataset.step), l.dataset.method]),
                    legend: [...chart.querySelectorAll('text[data-legend]')].map((t) => t.textContent),
                    alerts: [...d.querySelectorAll('#gae-alerts > li')].map((li) => [li.dataset.region, li.dataset.method,
                                                                                   li.querySelector('b').textContent]),
                    order: [after(d.querySelector('.gae-curves'), chart), after(chart, d.querySelector('#gae-samples'))],
                }};
            }})()""")
        assert drawn["lines"] == [["gae", "none"], ["rollout", "none"], ["random", "5 4"]]
        assert drawn["legend"] == [*METHODS, "random"]
        steps = region["share"]["steps"]
        assert sorted(drawn["dots"]) == sorted([m, s] for m in (*METHODS, "random") for s in steps)
        assert drawn["marks"] == [[a.step, a.method] for a in raised]
        assert drawn["alerts"] == [["spurious_word", a.method, a.markdown().split("\n")[0].strip("*")] for a in raised]
        assert drawn["order"] == [True, True], "the regions sit after the faithfulness curves, before the samples"
        assert page.script_errors() == []


# --- what the tab has, malformed entries, the run the address names ---------------------------------------------------


def _dashboard_run(folder, methods=("gae", "rollout"), steps=(1,), scores=True, maps=None):
    """A run written by TensorBoardViews.write from explanations of an untrained ViT (2 samples, each step), with the
    faithfulness scores of the last step; ``maps``: method -> ``[2, 17]`` token relevance written instead of explain's.
    Returns the SummaryWriter, open, so that a test can add entries."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    x = torch.rand(2, 1, 8, 8)
    model = small_vit()
    writer = SummaryWriter(str(folder))
    views = TensorBoardViews()
    for step in steps:
        explanations = {m: explain(model, x, method="gae" if maps and m in maps else m) for m in methods}
        for method, tokens in (maps or {}).items():
            explanations[method] = explanations[method].__class__(**{**explanations[method].__dict__, "tokens": tokens,
                                                                   "method": method})
        scalars = {f"positive_perturbation_auc/{m}": 0.3 + 0.1 * i for i, m in enumerate(methods)} if scores else None
        views.write([writer], step, modality=ImageTokens(patch_size=2), inputs=x, shown=x, sample_indices=[4, 9],
                    explanations=explanations, scalars=scalars)
    return writer


def _entry(writer, step, tag, value, kind=None, content=None, **fields):
    """One dashboard tensor as any writer could leave it: ``value`` under ``tag``, described by ``content`` (raw bytes)
    or by ``metadata.encode(kind, **fields)``."""
    from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_TENSOR, Summary, SummaryMetadata
    from tensorboard.util import tensor_util

    from lightning_gae.tensorboard import metadata

    described = content if content is not None else metadata.encode(kind, **fields)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="gae", content=described),
                           data_class=DATA_CLASS_TENSOR)
    value = Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(value), metadata=meta)
    writer._get_file_writer().add_summary(Summary(value=[value]), step)


def _routes(logdir):
    """The plugin's routes over ``logdir`` read by TensorBoard's own multiplexer and data provider, as a werkzeug test
    client: ``get(path) -> (status, JSON or text)``."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from lightning_gae.tensorboard.plugin import GAEDashboardPlugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gae": 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    context = base_plugin.TBContext(data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)),
                                    logdir=str(logdir))
    apps = GAEDashboardPlugin(context).get_plugin_apps()

    def get(path):
        route, _, query = path.partition("?")
        response = Client(apps[route], Response).get(f"/?{query}")
        text = response.get_data(as_text=True)
        return response.status_code, json.loads(text) if response.mimetype == "application/json" else text

    return get


# Each a malformed entry beside a good run: (name, step, tag, value, kind or raw content, fields, what the reason says).
_STRINGS = np.array([b"a", b"b"], dtype=object)
PROBES = [
    ("relevance of strings", 1, "gae_dashboard/relevance/gae/x", _STRINGS, "relevance",
     {"sample": 4, "method": "gae", "space": "tokens", "order": 0}, "not numbers"),
    ("relevance too large", 1, "gae_dashboard/relevance/gae/x", np.zeros((1 << 22) + 1, dtype=np.int8), "relevance",
     {"sample": 4, "method": "gae", "space": "tokens", "order": 0}, "more than"),
    ("relevance without a method", 1, "gae_dashboard/relevance/nameless/x", np.ones(17), "relevance",
     {"sample": 4, "space": "tokens"}, "no 'method' field"),
    ("relevance ordered by a word", 1, "gae_dashboard/relevance/worded/x", np.ones(17), "relevance",
     {"sample": 4, "method": "worded", "space": "tokens", "order": "first"}, "'order' field"),
    ("relevance in an unknown space", 1, "gae_dashboard/relevance/spaced/x", np.ones(17), "relevance",
     {"sample": 4, "method": "spaced", "space": "elsewhere", "order": 5}, "'elsewhere'"),
    ("prediction of two values", 1, "gae_dashboard/prediction/x", np.ones(2), "prediction", {"sample": 4},
     "holds 2 values"),
    ("curve of one row", 1, "gae_dashboard/curve/m/gae", np.ones((1, 4)), "curve", {"metric": "m", "method": "gae"},
     "[2, S]"),
    ("score of one value", 1, "gae_dashboard/score/m/gae", np.ones(1), "score", {"metric": "m", "method": "gae"},
     "holds 1 values"),
    ("region of no value", 1, "gae_dashboard/region/r/share/gae", np.ones(0), "region",
     {"region": "r", "stat": "share", "method": "gae"}, "holds 0 values"),
    ("alert of numbers", 1, "gae_dashboard/alert/r/gae", np.ones(3), "alert", {"region": "r", "method": "gae"},
     "not strings"),
    ("image input of one channel", 1, "gae_dashboard/input/x", np.zeros((8, 8)), "input",
     {"sample": 12, "modality": "image", "grid": [4, 4], "prefix_tokens": 1}, "[H, W, 3]"),
    ("image input of NaN pixels", 1, "gae_dashboard/input/y", np.full((8, 8, 3), np.nan), "input",
     {"sample": 13, "modality": "image", "grid": [4, 4], "prefix_tokens": 1}, "0..255"),
    ("description not JSON", 1, "gae_dashboard/relevance/bad/x", np.ones(17), b"{not json", {}, "not JSON"),
    ("description a list", 1, "gae_dashboard/relevance/listed/x", np.ones(17), b"[1, 2]", {}, "not JSON"),
]


@pytest.mark.parametrize("probe", PROBES, ids=[p[0] for p in PROBES])
def test_a_malformed_entry_costs_only_itself_and_says_why(tmp_path, probe):
    name, step, tag, value, kind, fields, why = probe
    writer = _dashboard_run(tmp_path / "run")
    if isinstance(kind, bytes):
        _entry(writer, step, tag, value, content=kind)
    else:
        _entry(writer, step, tag, value, kind, **fields)
    writer.close()
    get = _routes(tmp_path)
    assert get("/runs") == (200, {"runs": ["run"]})
    code, info = get("/run?run=run")
    assert code == 200, info
    # The rest of the run: both samples, both methods, the scores, the step.
    assert [s["sample"] for s in info["samples"]] == [4, 9] and info["methods"][:2] == ["gae", "rollout"]
    assert info["steps"] == [1] and [e["metric"] for e in info["summary"]] == ["positive_perturbation_auc"]
    code, at = get("/step?run=run&step=1")
    assert code == 200, at
    assert {m for s in ("4", "9") for m, r in at["samples"][s]["relevance"].items() if "values" in r} >= {"gae", "rollout"}
    # The entry itself: listed with its tag and why, once, by /run or (read at its step) by /step.
    listed = [p for p in info["problems"] + at["problems"] if p["tag"] == tag]
    assert listed and all(why in p["why"] for p in listed), (info["problems"], at["problems"])


def test_a_relevance_map_that_cannot_be_read_says_why_in_its_place(tmp_path):
    writer = _dashboard_run(tmp_path / "run")
    _entry(writer, 1, "gae_dashboard/relevance/broken/val_4", np.array([b"oops"], dtype=object), "relevance",
           sample=4, method="broken", space="tokens", order=2)
    writer.close()
    get = _routes(tmp_path)
    assert get("/run?run=run")[1]["methods"] == ["gae", "rollout", "broken"]
    _, at = get("/step?run=run&step=1")
    assert at["samples"]["4"]["relevance"]["broken"] == {"error": "it holds object values, not numbers"}
    assert all("values" in at["samples"][s]["relevance"][m] for s in ("4", "9") for m in ("gae", "rollout"))


def test_each_method_is_drawn_signed_or_not_by_its_registered_fact(tmp_path):
    """AttnLRP is signed: one diverging colormap in every sample, even a sample whose map has no negative value; GAE is
    not: one sequential colormap even where its map has a rounding-size negative value."""
    positive = torch.rand(2, 17, generator=torch.Generator().manual_seed(1))
    mixed = positive.clone()
    mixed[1] -= 0.5
    gae = positive.clone()
    gae[1, 3] = -1e-7
    writer = _dashboard_run(tmp_path / "run", methods=("gae", "attnlrp"), maps={"gae": gae, "attnlrp": mixed})
    writer.close()
    _, info = _routes(tmp_path)("/run?run=run")
    assert info["signed"] == {"gae": False, "attnlrp": True}

    views = TensorBoardViews()
    ranges = views.ranges({"gae": gae.numpy(), "attnlrp": positive.numpy()}, None)
    colormaps = {m: {display.colormap_for(vmin < 0) for vmin, _, _ in r} for m, r in ranges.items()}
    assert colormaps == {"gae": {"inferno"}, "attnlrp": {"RdBu_r"}}
    assert all(vmin == -vmax for vmin, vmax, _ in ranges["attnlrp"]), "signed: symmetric limits, white at 0"


@pytest.fixture(scope="module")
def dashboard_runs(tmp_path_factory):
    """A logdir of written runs served by a real ``tensorboard``: ``first`` and ``second`` (two steps each, ``second``
    with a map that cannot be read), ``scores_only`` (faithfulness scores, no explanation step yet) and ``signed``."""
    root = tmp_path_factory.mktemp("dashboard_runs")
    _dashboard_run(root / "first", steps=(1, 2)).close()
    writer = _dashboard_run(root / "second", steps=(1, 2))
    _entry(writer, 2, "gae_dashboard/relevance/broken/val_4", np.array([b"oops"], dtype=object), "relevance",
           sample=4, method="broken", space="tokens", order=2)
    writer.close()
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(root / "scores_only"))
    TensorBoardViews().write_scores([writer], 3, {"positive_perturbation_auc/gae": 0.25,
                                                  "positive_perturbation_auc/gae/stderr": 0.01,
                                                  "positive_perturbation_auc/random": 0.5})
    writer.close()
    positive = torch.rand(2, 17, generator=torch.Generator().manual_seed(1))
    mixed = positive.clone()
    mixed[1] -= 0.5
    _dashboard_run(root / "signed", methods=("gae", "attnlrp"), maps={"gae": positive, "attnlrp": mixed}).close()
    with tensorboard_server(root) as base:
        yield {"root": root, "base": base}


def _open_gae(browser, base, address):
    page = browser.open(f"{base}/{address}")
    page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
    return page


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_the_address_selects_the_run_and_keeps_the_one_chosen(dashboard_runs):
    base = dashboard_runs["base"]
    shown = f"{DASHBOARD}.querySelector('#gae-run').value"
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        assert _open_gae(browser, base, "#gae").evaluate(shown) == "signed", "no run named: the last one"
        for address in ("#gae&run=first", "?run=first#gae", "#gae&p.gae.run=first"):
            page = _open_gae(browser, base, address)
            assert page.evaluate(shown) == "first", address
            assert page.evaluate(f"{DASHBOARD}.querySelector('#gae-dashboard').dataset.renderedStep") == "2"
        # Choosing another run writes it into the address, so that a reload or a bookmark opens it.
        page.evaluate(f"(() => {{ const s = {DASHBOARD}.querySelector('#gae-run'); s.value = 'second'; "
                      "s.dispatchEvent(new Event('change')); })()")
        page.wait_for("location.hash.includes('run=second')")
        assert page.evaluate("location.hash").startswith("#gae&")
        assert page.script_errors() == []


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_a_run_with_scores_and_no_pictures_says_so_and_draws_them_when_they_come(dashboard_runs):
    base, root = dashboard_runs["base"], dashboard_runs["root"]
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        page = _open_gae(browser, base, "#gae&run=scores_only")
        said = page.evaluate(f"{DASHBOARD}.querySelector('#gae-no-pictures').textContent")
        assert said.startswith('No pictures were logged yet in run "scores_only"') and "only the scores below" in said
        rows = page.evaluate(f"[...{DASHBOARD}.querySelectorAll('table.gae-ranking tr[data-method]')].map((r) => r.dataset.method)")
        assert rows == ["gae", "random"]
        # The run is still being written: its first explanation step arrives, and the open tab draws it.
        _dashboard_run(root / "scores_only", steps=(7,)).close()
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard').dataset.renderedStep === '7'", timeout=60)
        assert page.evaluate(f"{DASHBOARD}.querySelectorAll('canvas.gae-heatmap').length") == 4
        assert "still being written: step 7 arrived" in page.evaluate(f"{DASHBOARD}.querySelector('#gae-updated').textContent")
        assert page.script_errors() == []


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_a_map_that_cannot_be_read_says_why_and_the_rest_draws(dashboard_runs):
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        page = _open_gae(browser, dashboard_runs["base"], "#gae&run=second")
        boxes = page.evaluate(f"[...{DASHBOARD}.querySelectorAll('.gae-empty[data-method=broken]')].map((b) => b.textContent)")
        assert boxes == ["not drawn: this entry could not be read (it holds object values, not numbers)"]
        assert page.evaluate(f"{DASHBOARD}.querySelectorAll('canvas.gae-heatmap').length") == 4
        listed = page.evaluate(f"[...{DASHBOARD}.querySelectorAll('#gae-problems li')].map((li) => li.textContent)")
        assert listed == ["gae_dashboard/relevance/broken/val_4 (step 2): it holds object values, not numbers"]
        assert page.script_errors() == []


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_a_method_keeps_its_colormap_in_every_sample_and_zero_is_white_where_it_is_signed(dashboard_runs):
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        page = _open_gae(browser, dashboard_runs["base"], "#gae&run=signed")
        drawn = page.evaluate(f"""[...{DASHBOARD}.querySelectorAll('canvas.gae-heatmap')].map((c) =>
            [c.dataset.method, c.dataset.sample, c.dataset.colormap])""")
        assert sorted(drawn) == [["attnlrp", "4", "RdBu_r"], ["attnlrp", "9", "RdBu_r"],
                                 ["gae", "4", "inferno"], ["gae", "9", "inferno"]]
        # Signed: the bar runs from -m to m with 0 in the middle, in the sample whose map has no negative value too.
        bars = _bar_labels(page, "4")
        assert bars["attnlrp"][1] == "0" and float(bars["attnlrp"][0]) == -float(bars["attnlrp"][2])
        assert page.script_errors() == []


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_a_chart_of_few_points_links_to_custom_scalars_unsmoothed(dashboard_runs):
    with Chromium(find_chromium(), width=1200, height=900) as browser:
        page = _open_gae(browser, dashboard_runs["base"], "#gae&run=first")
        page.evaluate(f"{DASHBOARD}.querySelector('#gae-custom-scalars').click()")
        page.wait_for(f"{DEEP}('tf-custom-scalar-dashboard')", timeout=60)
        assert page.evaluate(f"{DEEP}('tf-custom-scalar-dashboard')._smoothingWeight") == 0
        assert page.script_errors() == []


def test_rows_named_as_a_causal_lm_names_its_answers_are_read_without_problems(tmp_path):
    # A causal LM's tracked samples are answer rows named "<index>/answer_<n>", not validation indices: the check of
    # malformed entries must read them as samples (it once refused every entry of such a run).
    from torch.utils.tensorboard import SummaryWriter

    from lightning_gae import ImageTokens, explain
    from lightning_gae.tensorboard.summary import TensorBoardViews

    torch.manual_seed(0)
    x = torch.rand(2, 1, 8, 8)
    model = small_vit()
    writer = SummaryWriter(str(tmp_path / "run"))
    names = ["138/answer_1", "138/answer_2"]
    TensorBoardViews().write([writer], 1, modality=ImageTokens(patch_size=2), inputs=x, shown=x, sample_indices=names,
                             explanations={"gae": explain(model, x, method="gae")}, scalars=None)
    writer.close()
    get = _routes(tmp_path)
    code, info = get("/run?run=run")
    assert code == 200 and info["problems"] == [], info.get("problems")
    assert [s["sample"] for s in info["samples"]] == names
    code, at = get("/step?run=run&step=1")
    assert code == 200 and at["problems"] == [] and all("values" in at["samples"][n]["relevance"]["gae"] for n in names)
