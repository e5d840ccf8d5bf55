"""The GAE dashboard: a TensorBoard plugin over the tensors :class:`~lightning_gae.tensorboard.TensorBoardViews` writes.

Installed with the package, it is found through the ``tensorboard_plugins`` entry point, so
``tensorboard --logdir runs`` shows a "GAE" tab. The Python side reads TensorBoard's data provider
and answers JSON under ``/data/plugin/gae/``; the frontend is ``static/index.js``, a plain ES
module that TensorBoard loads into the tab's iframe.

Routes (``run`` and ``step`` are query parameters):

* ``/runs``: the runs with dashboard data;
* ``/run?run=``: its steps, methods, metrics, the steps that have the metrics' curves, the tracked
  samples (input, modality layout, label; every token set's input for a model with several), each
  method's largest relevance magnitude over all steps, and the summary: per faithfulness metric, the
  methods ranked (value ± standard error; methods the errors do not tell apart share a rank) at every step
  where the metric was scored, at each step where every method ties on some metric why (``ties``: the note the run's
  summary prints, :func:`~lightning_gae.tensorboard.ranks.tie_note`), the explanations flagged as not faithful
  (``flags``), the declared regions' share and recall per method over the steps, ``random`` the floor
  (``regions``), and the alerts of suspect regions (``alerts``);
  ``signed`` per method (drawn on a diverging colormap, white at 0, or a sequential one), and ``problems``;
* ``/step?run=&step=``: at that step, every sample's prediction and raw relevance per method (and per
  token set, a decoder's target x source rows), why a map is all zero where it is, and every metric's
  curve per method, and ``problems``;

A malformed entry (a tensor of the wrong shape or type, a description that is not JSON or lacks a field,
more values than the tab draws) costs that entry alone: it is left out, and ``problems`` lists it with its
tag, its step and why (a relevance map's entry says it in place, as ``error``), so the rest of the run draws.
* ``/colormaps``: matplotlib's colormaps as 256-entry tables, and the line colours of the curves.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

import matplotlib
import numpy as np
from matplotlib.colors import ListedColormap
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from lightning_gae.methods import ALL_ZERO_DEFAULT, get_method, method_names
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics.functional.health import tied_groups
from lightning_gae.tensorboard import metadata

__all__ = ["ALL_ZERO_DEFAULT", "GAEDashboardLoader", "GAEDashboardPlugin", "zero_reason"]

_ALL_POINTS = 1_000_000  # read_tensors must be told how many points it may return; the dashboard wants them all
SEQUENTIAL_COLORMAPS = ("inferno", "magma", "viridis", "cividis", "Greys_r")
DIVERGING_COLORMAPS = ("RdBu_r", "PuOr_r", "coolwarm")


def zero_reason(method: str, value: np.ndarray) -> str | None:
    """The reason shown for a map that is exactly zero everywhere, instead of an all-black map (None for any other
    map): the method's registered ``all_zero`` text, or :data:`~lightning_gae.methods.ALL_ZERO_DEFAULT` for a method
    this process does not know (a method registered only in the process that wrote the run)."""
    finite = value[np.isfinite(value)]
    if finite.size and np.any(finite != 0):
        return None
    return get_method(method).all_zero if method in method_names() else ALL_ZERO_DEFAULT


def _ranked(values: dict[str, float], higher_is_better: bool, order: list[str]) -> list[str]:
    """Methods best first; equal values keep the callback's order of methods (``random`` last)."""
    place = {m: i for i, m in enumerate(order)}
    return sorted(values, key=lambda m: (-values[m] if higher_is_better else values[m], place.get(m, len(order)), m))


def _json_values(array: np.ndarray) -> list[Any]:
    """Nested lists for JSON, non-finite numbers as null (JSON has no NaN)."""
    values = np.asarray(array, dtype=np.float64)
    if values.ndim == 0:
        return [float(values) if math.isfinite(values) else None]
    if values.ndim == 1:
        return [float(v) if math.isfinite(v) else None for v in values.tolist()]
    return [_json_values(row) for row in values]


MAX_VALUES = 1 << 22
"""The most values one entry may hold (a 2048 x 2048 map); a larger one is refused as malformed, not sent."""


class Unreadable(ValueError):
    """An entry the GAE tab cannot draw; the message says why (listed in the answer's ``problems``)."""


def _numbers(value: np.ndarray, size: int | None = None, ndim: int | None = None) -> np.ndarray:
    """``value`` as float64, or :class:`Unreadable` when it is not numbers, is too large, or (``size``, ``ndim``)
    has another size or number of dimensions than its kind has."""
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise Unreadable(f"it holds {array.dtype} values, not numbers")
    if array.size > MAX_VALUES:
        raise Unreadable(f"it holds {array.size} values, more than the {MAX_VALUES} the tab draws")
    if ndim is not None and array.ndim != ndim:
        raise Unreadable(f"its shape is {list(array.shape)}; this kind is {ndim}-dimensional")
    if size is not None and array.size < size:
        raise Unreadable(f"it holds {array.size} values; this kind has {size}")
    return array.astype(np.float64)


def _strings(value: np.ndarray) -> list[str]:
    """A string tensor's strings (bytes decoded as UTF-8), or :class:`Unreadable` for numbers."""
    array = np.asarray(value)
    if array.dtype.kind not in "OSU":
        raise Unreadable(f"it holds {array.dtype} values, not strings")
    if array.size > MAX_VALUES:
        raise Unreadable(f"it holds {array.size} strings, more than the {MAX_VALUES} the tab draws")
    return [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in array.reshape(-1).tolist()]


def _int_list(d: dict[str, Any], field: str, length: int | None = None) -> list[Any]:
    found = d.get(field)
    if not isinstance(found, list) or (length is not None and len(found) != length):
        raise Unreadable(f"its {field!r} field is {found!r}; it needs a list" + ("" if length is None else f" of {length}"))
    return found


def _input_payload(d: dict[str, Any], value: np.ndarray) -> dict[str, Any]:
    """The JSON of an ``input`` (or ``set_input``) summary: its description and the input as a browser draws it;
    :class:`Unreadable` when the input or the layout the tab draws it with is malformed."""
    sample = {k: v for k, v in d.items() if k not in ("version", "kind")}
    if d["modality"] == "image":
        pixels = _numbers(value)
        if pixels.ndim != 3 or pixels.shape[-1] != 3:
            raise Unreadable(f"an image input is uint8 [H, W, 3]; this one is {list(pixels.shape)}")
        if not np.all((pixels >= 0) & (pixels <= 255)):
            raise Unreadable("its pixels are not all in 0..255")
        grid = _int_list(d, "grid", 2)
        if not all(isinstance(g, int) and g > 0 for g in grid) or not isinstance(d.get("prefix_tokens"), int):
            raise Unreadable(f"its patch grid {grid!r} or prefix_tokens {d.get('prefix_tokens')!r} is not whole numbers")
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        sample["input"] = {"height": int(pixels.shape[0]), "width": int(pixels.shape[1]),
                           "rgb": base64.b64encode(pixels.tobytes()).decode("ascii")}
    elif d["modality"] == "text":
        tokens = _strings(value)
        _int_list(d, "valid", len(tokens))
        _int_list(d, "muted", len(tokens))
        sample["input"] = {"tokens": tokens}
    else:
        values = _numbers(value).reshape(-1)
        if d["modality"] == "tabular":
            _int_list(d, "feature_names", values.size)
            if not isinstance(d.get("prefix_tokens"), int):
                raise Unreadable(f"its prefix_tokens {d.get('prefix_tokens')!r} is not a whole number")
        sample["input"] = {"values": _json_values(values)}
    return sample


def _problem(tag: str, d: dict[str, Any] | None, why: str, step: int | None = None) -> dict[str, Any]:
    """One entry of an answer's ``problems``."""
    found = {"tag": tag, "kind": None if d is None else d.get("kind"), "why": why}
    return found if step is None else {**found, "step": step}


def _route(serve: Callable[[Any, wrappers.Request], wrappers.Response]) -> Callable[..., Any]:
    """A WSGI route of a plugin method, by werkzeug's ``Request.application``: it passes the arguments before the
    environ through (the plugin), though its annotation takes a function of the request alone."""
    return wrappers.Request.application(serve)  # type: ignore[arg-type]  # werkzeug's annotation: no self

class GAEDashboardPlugin(base_plugin.TBPlugin):
    """Samples x methods at a chosen step, the step slider, the relevance values and the faithfulness curves."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._provider = context.data_provider

    def get_plugin_apps(self) -> dict[str, Callable[..., Any]]:
        return {
            "/index.js": self._serve_index,
            "/runs": self._serve_runs,
            "/run": self._serve_run,
            "/step": self._serve_step,
            "/colormaps": self._serve_colormaps,
        }

    def is_active(self) -> bool:
        # TensorBoard enables the tab when its data provider holds summaries of this plugin;
        # asked here, there are none.
        return False

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="GAE")

    # --- reading --------------------------------------------------------------------------------

    def _listing(self, request: wrappers.Request, run: str | None = None
                 ) -> dict[str, tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]]:
        """Run -> (tag -> the description of every readable dashboard series, the series whose description is not)."""
        if self._provider is None:
            return {}
        listing = self._provider.list_tensors(
            plugin_util.context(request.environ),
            experiment_id=plugin_util.experiment_id(request.environ),
            plugin_name=metadata.PLUGIN_NAME,
            run_tag_filter=None if run is None else provider.RunTagFilter(runs=[run]),
        )
        out: dict[str, tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]] = {}
        for name, series in listing.items():
            kept: dict[str, dict[str, Any]] = {}
            problems = []
            for tag, s in series.items():
                d = metadata.decode(s.plugin_content)
                why = ("its description is not JSON of a kind this version of lightning-gae reads" if d is None
                       else metadata.problem(d))
                if why is None and d is not None:
                    kept[tag] = d
                else:
                    problems.append(_problem(tag, d, why or ""))
            if kept or problems:
                out[name] = (kept, problems)
        return out

    def _run_descriptions(self, request: wrappers.Request) -> tuple[str, dict[str, dict[str, Any]], list[dict[str, Any]]]:
        run = request.args.get("run")
        if not run:
            raise errors.InvalidArgumentError("the 'run' query parameter is missing")
        described, problems = self._listing(request, run).get(run, ({}, []))
        if not described and not problems:
            raise errors.NotFoundError(f"run {run!r} has no GAE dashboard data")
        return run, described, problems

    def _read(self, request: wrappers.Request, run: str, tags: Iterable[str]) -> dict[str, list[provider.TensorDatum]]:
        data = self._provider.read_tensors(
            plugin_util.context(request.environ),
            experiment_id=plugin_util.experiment_id(request.environ),
            plugin_name=metadata.PLUGIN_NAME,
            downsample=_ALL_POINTS,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=list(tags)),
        )
        return data.get(run, {})

    @staticmethod
    def _of_kind(described: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
        return {tag: d for tag, d in described.items() if d["kind"] == kind}

    # --- routes ---------------------------------------------------------------------------------

    @_route
    def _serve_index(self, request: wrappers.Request) -> wrappers.Response:
        script = resources.files("lightning_gae.tensorboard").joinpath("static").joinpath("index.js").read_bytes()
        return http_util.Respond(request, script, "text/javascript")

    @_route
    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, {"runs": sorted(self._listing(request))}, "application/json")

    @_route
    def _serve_run(self, request: wrappers.Request) -> wrappers.Response:
        run, described, problems = self._run_descriptions(request)
        kinds = ("input", "set_input", "relevance", "prediction", "curve", "score", "flag", "region", "alert", "tie")
        of = {kind: self._of_kind(described, kind) for kind in kinds}
        data = self._read(request, run, [tag for kind in kinds for tag in of[kind]])
        steps = sorted({d.step for tag in of["prediction"] for d in data.get(tag, [])})
        # The faithfulness subset may be scored at a few steps only (by default once, when fit ends).
        curve_steps = sorted({d.step for tag in of["curve"] for d in data.get(tag, [])})
        relevance: dict[str, dict[str, Any]] = {}
        ranges: dict[str, float] = {}
        negative: dict[str, bool] = {}
        for tag, d in of["relevance"].items():
            # Listed even where no map of it can be read: its panels then say why.
            relevance[tag] = d
            for datum in data.get(tag, []):
                try:
                    finite = _numbers(datum.numpy)
                except Unreadable as why:
                    problems.append(_problem(tag, d, str(why), datum.step))
                    continue
                finite = finite[np.isfinite(finite)]
                top = float(np.abs(finite).max()) if finite.size else 0.0
                ranges[d["method"]] = max(ranges.get(d["method"], 0.0), top)
                negative[d["method"]] = negative.get(d["method"], False) or bool(np.any(finite < 0))
        sets: dict[int, list[dict[str, Any]]] = {}
        for tag, d in of["set_input"].items():
            if data.get(tag):
                try:
                    sets.setdefault(d["sample"], []).append(_input_payload(d, data[tag][-1].numpy))
                except Unreadable as why:
                    problems.append(_problem(tag, d, str(why), data[tag][-1].step))
        samples = []
        for tag, d in of["input"].items():
            points = data.get(tag)
            if not points:
                continue
            try:
                sample = _input_payload(d, points[-1].numpy)
            except Unreadable as why:
                problems.append(_problem(tag, d, str(why), points[-1].step))
                continue
            if d["sample"] in sets:
                sample["sets"] = sorted(sets[d["sample"]], key=lambda s: (s.get("order", 0), s["set"]))
            samples.append(sample)
        samples.sort(key=lambda s: (s.get("position", 0), s["sample"]))
        methods = [m for _, m in sorted({(d.get("order", 0), d["method"]) for d in relevance.values()})]
        metrics = sorted({d["metric"] for d in of["curve"].values()})
        payload = {"run": run, "steps": steps, "methods": methods, "floors": list(method_names("baseline")),
                   "metrics": metrics, "curve_steps": curve_steps,
                   "samples": samples, "ranges": ranges,
                   "signed": {m: get_method(m).signed if m in method_names() else negative.get(m, False) for m in methods},
                   "summary": self._summary(of["score"], data, methods, problems),
                   "ties": self._text_entries(of["tie"], data, (), problems),
                   "flags": self._text_entries(of["flag"], data, ("method", "cause"), problems),
                   "regions": self._regions(of["region"], data, methods, problems),
                   "alerts": self._text_entries(of["alert"], data, ("region", "method"), problems),
                   "problems": sorted(problems, key=lambda e: (e.get("step", -1), e["tag"]))}
        return http_util.Respond(request, payload, "application/json")

    @staticmethod
    def _regions(regions: dict[str, dict[str, Any]], data: dict[str, list[provider.TensorDatum]],
                 methods: list[str], problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per declared region, sorted by name: per stat (``share``, ``recall``) the steps it was logged at and per
        method (the callback's order, ``random`` last) its value at each of them (None where not logged)."""
        points: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
        for tag, d in regions.items():
            for datum in data.get(tag, []):
                try:
                    value = float(_numbers(datum.numpy, size=1).reshape(-1)[0])
                except Unreadable as why:
                    problems.append(_problem(tag, d, str(why), datum.step))
                    continue
                if math.isfinite(value):
                    points.setdefault(d["region"], {}).setdefault(d["stat"], {}).setdefault(d["method"], {})[datum.step] = value
        order = [*methods, RANDOM.name]
        out = []
        for region in sorted(points):
            entry: dict[str, Any] = {"region": region}
            for stat, by_method in points[region].items():
                steps = sorted({s for values in by_method.values() for s in values})
                ranked = sorted(by_method, key=lambda m: (m == RANDOM.name, order.index(m) if m in order else len(order), m))
                entry[stat] = {"steps": steps, "methods": {m: [by_method[m].get(s) for s in steps] for m in ranked}}
            out.append(entry)
        return out

    @staticmethod
    def _summary(scores: dict[str, dict[str, Any]], data: dict[str, list[provider.TensorDatum]],
                 methods: list[str], problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per metric: its direction, the steps it was scored at, and per method its value, standard error, sample
        count (None when not logged), rank and whether it ties (``tied``: the standard errors do not tell it from
        another method of its rank) at each of them; ``ranking`` is the methods best first at the last of those steps."""
        by_metric: dict[str, dict[str, Any]] = {}
        for tag, d in scores.items():
            entry = by_metric.setdefault(d["metric"], {"higher_is_better": bool(d.get("higher_is_better", True)),
                                                       "points": {}})
            for datum in data.get(tag, []):
                # [value, standard error] and, since the subset is scored on parts of it during fit, the sample count.
                try:
                    value, error, *count = (float(v) for v in _numbers(datum.numpy, size=2).reshape(-1)[:3])
                except Unreadable as why:
                    problems.append(_problem(tag, d, str(why), datum.step))
                    continue
                if math.isfinite(value):
                    entry["points"].setdefault(datum.step, {})[d["method"]] = (
                        value, error if math.isfinite(error) else None,
                        int(count[0]) if count and math.isfinite(count[0]) else None)
        order = [*methods, RANDOM.name]
        out = []
        for metric in sorted(by_metric):
            entry = by_metric[metric]
            steps = sorted(entry["points"])
            if not steps:
                continue
            present = _ranked({m: 0.0 for s in steps for m in entry["points"][s]}, True, order)
            table: dict[str, dict[str, list[Any]]] = {m: {"values": [], "stderr": [], "counts": [], "ranks": [],
                                                                  "tied": []}
                                                      for m in present}
            ranking: list[str] = []
            for step in steps:
                at = entry["points"][step]
                ranking = _ranked({m: v for m, (v, _, _) in at.items()}, entry["higher_is_better"], order)
                # Methods the standard errors do not tell apart share a rank (a missing error ties).
                groups = tied_groups({m: at[m][0] for m in ranking},
                                     {m: math.nan if at[m][1] is None else at[m][1] for m in ranking},
                                     entry["higher_is_better"])
                rank = {m: (k, len(group) > 1) for k, group in enumerate(groups, 1) for m in group}
                ranking = [m for group in groups for m in group]
                for method in present:
                    value, error, count = at.get(method, (None, None, None))
                    table[method]["values"].append(value)
                    table[method]["stderr"].append(error)
                    table[method]["counts"].append(count)
                    table[method]["ranks"].append(rank[method][0] if method in at else None)
                    table[method]["tied"].append(rank[method][1] if method in at else None)
            out.append({"metric": metric, "higher_is_better": entry["higher_is_better"], "steps": steps,
                        "ranking": ranking, "methods": table})
        return out

    @staticmethod
    def _text_entries(entries: dict[str, dict[str, Any]], data: dict[str, list[provider.TensorDatum]],
                      keys: tuple[str, ...], problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Text entries (the flags of unfaithful explanations, the alerts of suspect regions): each one's step, its
        ``keys`` and its markdown, by step and then those keys."""
        out = []
        for tag, d in entries.items():
            for datum in data.get(tag, []):
                try:
                    text = "\n".join(_strings(datum.numpy))
                except Unreadable as why:
                    problems.append(_problem(tag, d, str(why), datum.step))
                    continue
                out.append({"step": datum.step, **{k: d[k] for k in keys}, "text": text})
        return sorted(out, key=lambda e: (e["step"], *(e[k] for k in keys)))

    @_route
    def _serve_step(self, request: wrappers.Request) -> wrappers.Response:
        run, described, problems = self._run_descriptions(request)
        try:
            step = int(request.args.get("step", ""))
        except ValueError:
            raise errors.InvalidArgumentError("the 'step' query parameter must be an integer") from None
        wanted = {tag: d for tag, d in described.items() if d["kind"] in ("prediction", "relevance", "curve", "set_relevance",
                                                                        "row_labels")}
        data = self._read(request, run, wanted)
        at_step = {tag: next((p.numpy for p in data.get(tag, []) if p.step == step), None) for tag in wanted}
        if all(v is None for v in at_step.values()):
            raise errors.NotFoundError(f"run {run!r} has no GAE dashboard data at step {step}")
        samples: dict[str, dict[str, Any]] = {}
        curves: dict[str, dict[str, Any]] = {}
        problems = [p for p in problems if p.get("step") in (None, step)]
        for tag, d in wanted.items():
            value = at_step[tag]
            if value is None:
                continue
            try:
                self._step_entry(d, value, samples, curves)
            except Unreadable as why:
                problems.append(_problem(tag, d, str(why), step))
                if d["kind"] == "relevance":
                    # In place of the map: the panel says why it is not drawn.
                    samples.setdefault(str(d["sample"]), {"relevance": {}})["relevance"][d["method"]] = {"error": str(why)}
        return http_util.Respond(request, {"run": run, "step": step, "samples": samples, "curves": curves,
                                           "problems": sorted(problems, key=lambda e: e["tag"])}, "application/json")

    @staticmethod
    def _step_entry(d: dict[str, Any], value: np.ndarray, samples: dict[str, dict[str, Any]],
                    curves: dict[str, dict[str, Any]]) -> None:
        """One entry of a step into ``samples`` or ``curves``; :class:`Unreadable` when it is malformed."""
        if d["kind"] == "curve":
            points = _numbers(value, ndim=2)
            if points.shape[0] != 2:
                raise Unreadable(f"a curve is [2, S] (fractions, values); this one is {list(points.shape)}")
            curves.setdefault(d["metric"], {})[d["method"]] = {"fractions": _json_values(points[0]),
                                                               "values": _json_values(points[1])}
            return
        if d["kind"] == "row_labels":
            labels = _strings(value)
            samples.setdefault(str(d["sample"]), {"relevance": {}})["row_labels"] = labels
            return
        if d["kind"] == "prediction":
            pred, target, prob = _json_values(_numbers(value, size=3).reshape(-1)[:3])
            samples.setdefault(str(d["sample"]), {"relevance": {}})["prediction"] = {"pred": pred, "target": target,
                                                                                     "probability": prob}
            return
        if d["space"] not in ("tokens", "input", "rows"):
            raise Unreadable(f"its space {d['space']!r} is not 'tokens', 'input' or 'rows'")
        values = _numbers(value, ndim=2 if d["space"] == "rows" else None)
        if d["space"] == "input" and values.ndim not in (1, 2):
            raise Unreadable(f"a map in input units is [H, W] or [N]; this one is {list(values.shape)}")
        entry: dict[str, Any] = {"space": d["space"], "shape": list(values.shape), "values": _json_values(values.reshape(-1))}
        reason = zero_reason(d["method"], values)
        if reason is not None:
            entry["all_zero"] = reason
        elif d["space"] == "rows":
            # Rows of a decoder that are zero everywhere (e.g. one position's Grad-CAM) say why, too.
            zero = [t for t, row in enumerate(values) if zero_reason(d["method"], row) is not None]
            if zero:
                entry["zero_rows"], entry["zero_reason"] = zero, zero_reason(d["method"], np.zeros(1))
        sample = samples.setdefault(str(d["sample"]), {"relevance": {}})
        if d["kind"] == "relevance":
            sample["relevance"][d["method"]] = entry
        elif d["space"] == "rows":
            sample.setdefault("rows", {}).setdefault(d["set"], {})[d["method"]] = entry
        else:
            sample.setdefault("sets", {}).setdefault(d["set"], {})[d["method"]] = entry

    @_route
    def _serve_colormaps(self, request: wrappers.Request) -> wrappers.Response:
        def table(name: str) -> list[list[int]]:
            rgb = matplotlib.colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3]
            return (rgb * 255.0 + 0.5).astype(int).tolist()

        tab10 = matplotlib.colormaps["tab10"]
        assert isinstance(tab10, ListedColormap)  # a list of ten colours
        palette = (np.asarray(tab10.colors) * 255.0 + 0.5).astype(int).tolist()
        payload = {"sequential": {n: table(n) for n in SEQUENTIAL_COLORMAPS},
                   "diverging": {n: table(n) for n in DIVERGING_COLORMAPS}, "palette": palette}
        return http_util.Respond(request, payload, "application/json")


class GAEDashboardLoader(base_plugin.TBLoader):
    """Loads :class:`GAEDashboardPlugin`; the ``tensorboard_plugins`` entry point names this class.

    TensorBoard keeps 10 random points per tag of a plugin it does not know; the dashboard's step
    slider needs every explanation step, so unless ``--samples_per_plugin`` says otherwise for
    ``gae``, all are kept (the tensors are small: a few samples x methods x tokens per step).
    """

    def fix_flags(self, flags: Any) -> None:
        samples = getattr(flags, "samples_per_plugin", None)
        if isinstance(samples, dict):
            samples.setdefault(metadata.PLUGIN_NAME, 0)

    def load(self, context: base_plugin.TBContext) -> GAEDashboardPlugin:
        return GAEDashboardPlugin(context)
