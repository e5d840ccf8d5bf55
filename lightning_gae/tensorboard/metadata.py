"""What the callback writes for the GAE dashboard and how the plugin recognises it.

Every dashboard summary is a tensor whose ``SummaryMetadata.plugin_data`` names :data:`PLUGIN_NAME`
and carries a JSON description (``kind`` and the sample, method or metric it belongs to), so the
plugin reads the meaning from the metadata, never from the tag's spelling. Kinds:

* ``input``: one tracked sample as a person sees it: ``uint8 [H, W, 3]`` pixels, token strings
  ``[T]`` or feature values ``[F]``; the JSON holds the modality's layout (patch grid, special
  tokens, feature names), the label and its class name;
* ``prediction``: per step and sample, ``float64 [3]``: predicted class, explained class, and the
  explained class's probability (NaN without logits);
* ``relevance``: per step, sample and method, the raw relevance: the explanation's token relevance
  ``[N]`` (``space="tokens"``) or a Captum map in input units (``space="input"``: pixels ``[H, W]``,
  one value per token or feature); ``order`` is the method's place in the callback's list;
* ``curve``: per step, metric and method, ``float64 [2, S]``: fractions removed and the mean score;
* ``score``: per step where it was scored, metric and method, ``float64 [2]``: the scalar the loggers
  got (``<metric>/<method>``) and its standard error (NaN when there is none); ``higher_is_better``
  says which way the methods rank (the metric's own ``higher_is_better``);
* ``set_input`` and ``set_relevance`` (models with several token sets: encoder/decoder, image/text
  towers): the same as ``input`` and ``relevance`` for every token set, named by ``set``. A
  ``set_relevance`` of ``space="rows"`` is ``[T, N]``: one relevance row per position ``t`` of the
  query set (a decoder), each explained with ``query=t``. For such models ``input`` and
  ``relevance`` hold the query set alone, so a reader that knows only those kinds shows that set;
* ``flag``: per step where it was raised, method and ``cause`` (``"identity"``: its relevance outside the read-out
  token is negligible beside the identity; ``"random"``: not better than random beyond the standard error), a
  string ``[1]``: the flag as markdown (what was measured, the run's most faithful method, the likely cause);
* ``region``: per step, declared region (``region``), ``stat`` (``"share"`` or ``"recall"``) and method (``random``: the
  floor), ``float64 [1]``: the scalar the loggers got (``region_<stat>_<region>/<method>``);
* ``alert``: per step where it was raised, ``region`` and ``method``, a string ``[1]``: the alert as markdown (a
  suspect region took the method's relevance: the share, the samples, the method's faithfulness, the removal check);
* ``tie``: per step where the methods' faithfulness was scored and every method ties on some metric, a string ``[1]``:
  why (:func:`lightning_gae.tensorboard.ranks.tie_note`, the note the Text tab's table and the run's summary print).
"""

from __future__ import annotations

import json
from typing import Any

PLUGIN_NAME = "gae"
"""The plugin's name: TensorBoard's route prefix ``/data/plugin/gae/`` and the summaries' owner."""

TAG_PREFIX = "gae_dashboard"
"""Every dashboard tag starts with it, so no dashboard tensor can share a tag with a scalar or an image."""

VERSION = 1

KINDS = ("input", "prediction", "relevance", "curve", "score", "set_input", "set_relevance", "row_labels", "flag",
         "region", "alert", "tie")


_SAMPLE = (int, str)  # a validation index, or a row's name ("138/answer_1": a causal LM's answer token)

FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "input": {"sample": _SAMPLE, "modality": str},
    "set_input": {"sample": _SAMPLE, "modality": str, "set": str},
    "prediction": {"sample": _SAMPLE},
    "relevance": {"sample": _SAMPLE, "method": str, "space": str},
    "set_relevance": {"sample": _SAMPLE, "method": str, "set": str, "space": str},
    "row_labels": {"sample": _SAMPLE},
    "curve": {"metric": str, "method": str},
    "score": {"metric": str, "method": str},
    "flag": {"method": str, "cause": str},
    "region": {"region": str, "stat": str, "method": str},
    "alert": {"region": str, "method": str},
    "tie": {},
}
"""Per kind, the fields a description must have and their types (what the GAE tab reads)."""

OPTIONAL: dict[str, type] = {"order": int, "position": int, "higher_is_better": bool, "query": bool}
"""Fields some descriptions have, and their types when they do."""


def problem(description: dict[str, Any]) -> str | None:
    """Why the GAE tab cannot read a decoded description (a field missing or of the wrong type), or None."""
    kind = description["kind"]
    for name, kinds in [*FIELDS[kind].items(), *((k, t) for k, t in OPTIONAL.items() if k in description)]:
        if name not in description:
            return f"its description has no {name!r} field (a {kind!r} entry needs {sorted(FIELDS[kind])})"
        value = description[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))):
            names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            return f"its {name!r} field is {value!r}, not of type {names}"
    return None


def encode(kind: str, **fields: Any) -> bytes:
    """The ``plugin_data.content`` of a dashboard summary of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown dashboard summary kind {kind!r}; one of {KINDS}")
    return json.dumps({"version": VERSION, "kind": kind, **fields}, sort_keys=True).encode("utf-8")


def decode(content: bytes) -> dict[str, Any] | None:
    """The description in a summary's ``plugin_data.content``, or None when it is not one this version reads."""
    try:
        description = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(description, dict) or description.get("version") != VERSION or description.get("kind") not in KINDS:
        return None
    return description
