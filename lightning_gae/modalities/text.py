"""Text: one token per input id, drawn as coloured tokens, removed by a mask id or from the attention mask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from lightning_gae import display
from lightning_gae._structures import input_tensor, keyword_inputs, replace_input
from lightning_gae.modalities.regions import Region
from lightning_gae.modalities.tokens import InterpolateMode, MethodMap, Modality, check_cmap, check_tokens, spread

__all__ = ["TextTokens"]


class TextTokens(Modality):
    """Text: one token per input id, so relevance is already aligned with ``input_ids``.

    Args:
        tokenizer: a Hugging Face tokenizer (or a name/path to load one with ``AutoTokenizer``) that
            turns ids into strings; also the default source of ``special_ids`` and ``pad_id``.
        vocab: id -> string, used when there is no tokenizer.
        special_ids: ids drawn grey and left out of the colour scale (``[CLS]``, ``[SEP]``, which
            otherwise often take most of the relevance); None means the tokenizer's special ids.
        pad_id: padding id, omitted from the drawing and zeroed when no ``attention_mask`` is given; None: the tokenizer's.
        cmap: matplotlib colormap of :meth:`render`'s token backgrounds (``comparison_grid``); None: the package's
            convention, :func:`~lightning_gae.display.colormap_for` the method's ``signed`` fact.
        mask_id: the id a removed token becomes; None means the tokenizer's mask token, else ``pad_id``.
        removal: how the faithfulness metrics remove a token: ``"replace"`` its id by ``mask_id``, or drop it from the
            ``"attention"`` mask (the inputs must then be a mapping with one). Special and padded tokens are never removed.

    Example (a character vocabulary instead of a tokenizer: ``[CLS]`` is special, ``_`` pads, its relevance is 0):

    >>> import torch
    >>> modality = TextTokens(vocab=["_", "[CLS]", *"abc"], special_ids=[1], pad_id=0)
    >>> ids = torch.tensor([[1, 2, 3, 0]])
    >>> modality.token_strings(ids[0]), modality.to_input(torch.tensor([[0.5, 0.2, 0.3, 0.9]]), ids)
    (['[CLS]', 'a', 'b', '_'], tensor([[0.5000, 0.2000, 0.3000, 0.0000]]))
    """

    # Samples may carry rationale tokens [B, T] (ERASER): the relevance is scored by how it finds them.
    ground_truth = "rationale"

    def __init__(
        self,
        tokenizer: Any = None,
        vocab: Sequence[str] | None = None,
        special_ids: Sequence[int] | None = None,
        pad_id: int | None = None,
        cmap: str | None = None,
        mask_id: int | None = None,
        removal: Literal["replace", "attention"] = "replace",
    ) -> None:
        if cmap is not None:
            check_cmap(cmap)
        if removal not in ("replace", "attention"):
            raise ValueError(f"removal={removal!r}; use 'replace' (by mask_id) or 'attention' (zero the attention mask)")
        if isinstance(tokenizer, str):
            # Optional dependency: only a tokenizer given by name needs transformers here.
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        _check_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.vocab = None if vocab is None else list(vocab)
        if special_ids is None:
            special_ids = getattr(tokenizer, "all_special_ids", ())
        self.special_ids = frozenset(int(i) for i in special_ids)
        self.pad_id = getattr(tokenizer, "pad_token_id", None) if pad_id is None else pad_id
        self.cmap = cmap
        self.mask_id = getattr(tokenizer, "mask_token_id", None) if mask_id is None else mask_id
        self.removal = removal

    def __repr__(self) -> str:
        source = type(self.tokenizer).__name__ if self.tokenizer is not None else ("vocab" if self.vocab else "ids")
        return f"TextTokens({source}, pad_id={self.pad_id})"

    @staticmethod
    def _input_ids(inputs: Any) -> Tensor:
        keywords = keyword_inputs(inputs)
        ids = input_tensor(inputs) if keywords is None else keywords.get("input_ids")
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            raise ValueError("TextTokens needs input_ids [B, T]: a tensor, or a mapping (a tokenizer's output) with "
                             f"'input_ids'{_other_modality(ids)}")
        return ids

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Relevance per input id.

        Args:
            tokens: ``[B, T]`` token relevance.
            inputs: ``input_ids [B, T]``, or a mapping with ``input_ids`` (and optionally ``attention_mask``).

        Returns:
            float32 ``[B, T]``: the same values in place (special tokens kept), padding 0.
        """
        ids = self._input_ids(inputs)
        check_tokens(tokens, ids.shape[0])
        if tokens.shape[1] != ids.shape[1]:
            raise ValueError(f"{tokens.shape[1]} token relevances for {ids.shape[1]} input ids; TextTokens expects one per id")
        return tokens.float().masked_fill(~self.real_tokens(inputs).to(tokens.device), 0.0)

    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """One score per input id ``[B, T]``; embeddings-shaped maps ``[B, T, D]`` are summed over D."""
        ids = self._input_ids(inputs)
        scores = attributions.float().sum(dim=-1) if attributions.dim() == 3 else attributions.float()
        if scores.shape != ids.shape:
            raise ValueError(f"attributions of shape {tuple(attributions.shape)} do not fit input_ids {tuple(ids.shape)}: "
                             "pass one value per token [B, T] (or [B, T, D] for embeddings)")
        return scores

    def removable(self, inputs: Any) -> Tensor:
        """Real tokens that are not special (``special_ids``), by the attention mask or ``pad_id``."""
        return self.real_tokens(inputs) & ~self.special_tokens(inputs)

    def real_tokens(self, inputs: Any) -> Tensor:
        """bool ``[B, T]``: the tokens that are not padding, by the ``attention_mask`` (when the inputs carry one of
        their shape), else by ``pad_id``; all of them when neither says."""
        ids = self._input_ids(inputs)
        mask = (keyword_inputs(inputs) or {}).get("attention_mask")
        if isinstance(mask, Tensor) and mask.shape == ids.shape:
            return mask != 0
        if self.pad_id is not None:
            return ids != self.pad_id
        return torch.ones_like(ids, dtype=torch.bool)

    def special_tokens(self, inputs: Any) -> Tensor:
        """bool ``[B, T]``: the tokens whose id is one of ``special_ids`` (CLS, SEP, ...)."""
        ids = self._input_ids(inputs)
        return torch.isin(ids, torch.tensor(sorted(self.special_ids), dtype=ids.dtype, device=ids.device))

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """Dropped tokens become ``mask_id`` (or ``fill``'s ids), or leave the attention mask."""
        ids = self._input_ids(inputs)
        drop = drop.to(ids.device) & self.removable(inputs)
        if self.removal == "attention":
            mask = (keyword_inputs(inputs) or {}).get("attention_mask")
            if not isinstance(mask, Tensor) or mask.shape != ids.shape:
                raise ValueError("TextTokens(removal='attention') needs inputs as a mapping with an attention_mask [B, T]")
            return replace_input(inputs, mask, mask.masked_fill(drop, 0))
        removed_id = self.mask_id if self.mask_id is not None else self.pad_id
        if fill is not None:
            replacement = self._input_ids(fill)
        elif removed_id is not None:
            replacement = torch.full_like(ids, removed_id)
        else:
            raise ValueError("TextTokens cannot remove tokens without an id to put in their place: pass mask_id= "
                             "(or pad_id=, or a tokenizer with a mask or pad token), or use removal='attention'")
        return replace_input(inputs, ids, torch.where(drop, replacement, ids))

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        return x.dim() == 2 and not x.is_floating_point() and x.shape[1] == num_tokens

    # --- what the rest of the package asks (Modality's hooks) -----------------------------------

    def relevance_on(self, x: Tensor, tokens: Tensor, mode: InterpolateMode = "nearest") -> Tensor | None:
        """Token ids ``[B, T]`` get :meth:`to_input` (padding 0), embeddings ``[B, T, ...]`` the tokens' relevance on
        every entry; None for an input of another length."""
        if x.dim() < 2 or x.shape[1] != tokens.shape[1]:
            return None
        if x.dim() == 2 and not x.is_floating_point():
            return self.to_input(tokens, x)
        return spread(tokens, x)

    def token_labels(self, x: Tensor, count: int) -> list[str]:
        """The tokens' strings (:meth:`token_strings`)."""
        return self.token_strings(x)

    def vocabulary(self, count: int) -> list[str] | None:
        """A decoder's classes are its vocabulary: ids ``0 .. count - 1`` as token strings."""
        return self.token_strings(list(range(count)))

    def region_tokens(self, region: Region, inputs: Any) -> Tensor:
        """The tokens whose id is in ``token_ids``, or where ``predicate(input_ids)`` is True; padding never is."""
        # The reader of input_ids above raises its own message; a region names its own.
        keywords = keyword_inputs(inputs)
        ids = input_tensor(inputs) if keywords is None else keywords.get("input_ids")
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            raise ValueError("TextTokens regions need input_ids [B, T]: a tensor, or a mapping with 'input_ids'")
        if region.token_ids is not None:
            inside = torch.isin(ids, torch.tensor(region.token_ids, dtype=ids.dtype, device=ids.device))
        elif region.predicate is not None:
            inside = torch.as_tensor(region.predicate(ids), device=ids.device)
            if inside.shape != ids.shape:
                raise ValueError(f"Region {region.name!r}: predicate returned shape {tuple(inside.shape)} for input_ids "
                                 f"{tuple(ids.shape)}; it must return one bool per token")
            inside = inside.bool()
        else:
            raise region.mismatch(self, "token_ids= or predicate=")
        return inside & self.real_tokens(inputs).to(ids.device)

    def drawn_units(self, shown: Tensor, inputs: Any) -> tuple[Tensor, Tensor] | None:
        """``(valid, muted)``: real tokens (the ``attention_mask`` among ``inputs``, else not padding), special tokens."""
        mask = (keyword_inputs(inputs) or {}).get("attention_mask")
        ids = {"input_ids": shown, "attention_mask": mask} if isinstance(mask, Tensor) else shown
        return self.real_tokens(ids), self.special_tokens(ids)

    def _drawn_tokens(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None) -> tuple[list[str], np.ndarray]:
        keep = np.ones(x.shape[-1], dtype=bool) if flags is None else np.asarray(flags[0], dtype=bool)
        return [t for t, v in zip(self.token_strings(x), keep) if v], keep

    def _muted(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None, keep: np.ndarray) -> list[bool]:
        muted = np.isin(x.numpy(), sorted(self.special_ids)) if flags is None else np.asarray(flags[1], dtype=bool)
        return muted[keep].tolist()

    def picture(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None, header: str,
                panel_px: int, alpha: float) -> np.ndarray:
        """A row of coloured tokens per method (padding left out, special tokens grey)."""
        tokens, keep = self._drawn_tokens(x, flags)
        rows = [(m.method, m.values[keep], m.vrange) for m in maps]
        return display.token_rows(tokens, rows, muted=self._muted(x, flags, keep), header=header)

    def set_panels(self, name: str, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None,
                   panel_px: int, alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """The text on one line, and each method's coloured tokens, twice a panel wide."""
        tokens, keep = self._drawn_tokens(x, flags)
        muted = self._muted(x, flags, keep)
        cells = [display.token_rows(tokens, [("", m.values[keep], m.vrange)], muted=muted, width=2 * panel_px)
                 for m in maps]
        return display.text_line(" ".join(tokens), 2 * panel_px), cells

    def panels(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None,
               panel_px: int, alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """As :meth:`set_panels`."""
        return self.set_panels("", x, maps, flags, panel_px, alpha)

    def table_units(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None) -> tuple[str, list[str]] | None:
        """A row per drawn token."""
        return "token", self._drawn_tokens(x, flags)[0]

    def dashboard_input(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None,
                        count: int) -> tuple[dict[str, Any], np.ndarray]:
        """The token strings, which are real and which special."""
        valid, muted = flags if flags is not None else (np.ones(x.shape[-1], dtype=bool), np.zeros(x.shape[-1], dtype=bool))
        fields = {"modality": "text", "valid": np.asarray(valid).tolist(), "muted": np.asarray(muted).tolist()}
        return fields, np.array([t.encode("utf-8") for t in self.token_strings(x)], dtype=object)

    def token_strings(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Display strings of ``ids``: the tokenizer's tokens, else ``vocab`` entries, else the ids."""
        values = ids.tolist() if isinstance(ids, Tensor) else [int(i) for i in ids]
        if self.tokenizer is not None:
            return list(self.tokenizer.convert_ids_to_tokens(values))
        if self.vocab is not None:
            return [self.vocab[i] for i in values]
        return [str(i) for i in values]

    def render(self, ids: Tensor, relevance: Tensor | None, title: str, *, signed: bool | None = None) -> np.ndarray:
        """A strip of the tokens ``[T]`` coloured by relevance ``[T]`` (None: uncoloured), padding omitted.

        The colours span :func:`~lightning_gae.display.value_range` of the tokens that are not special (``signed`` as
        :meth:`Modality.render`), on :func:`~lightning_gae.display.colormap_for` it unless ``cmap`` was given.

        Returns:
            uint8 ``[h, w, 3]``; lines wrap at 720 px.
        """
        ids = ids.detach().cpu().reshape(-1)
        values = torch.zeros(ids.shape) if relevance is None else relevance.detach().float().cpu().reshape(-1)
        if values.shape != ids.shape:
            raise ValueError(f"render got {ids.numel()} ids and {values.numel()} relevance values")
        if self.pad_id is not None:
            keep = ids != self.pad_id
            ids, values = ids[keep], values[keep]
        muted = [i in self.special_ids for i in ids.tolist()]
        vmin, vmax = display.value_range(values[~torch.tensor(muted, dtype=torch.bool)], signed)
        # Without relevance, a colormap whose low end is white: the text alone, not the scale's colour of 0.
        cmap = "Greys" if relevance is None else self.cmap or display.colormap_for(vmin < 0)
        return display.token_strip(self.token_strings(ids), values, title, cmap=cmap, muted=muted, vrange=(vmin, vmax))


def _other_modality(found: Any) -> str:
    """What to pass instead of ``TextTokens`` for inputs that are not token ids."""
    if not isinstance(found, Tensor):
        return f"; got {type(found).__name__}"
    shape = f"; got a {str(found.dtype).removeprefix('torch.')} tensor of shape {tuple(found.shape)}"
    if found.dim() == 4:
        return (f"{shape}, images [B, C, H, W]: pass modality=ImageTokens(patch_size=...) (or modality=None, which "
                "infers it for a ViT on square images)")
    return shape


def _check_tokenizer(tokenizer: Any) -> None:
    """A tokenizer must turn ids into token strings the Hugging Face way (``convert_ids_to_tokens``); a raw
    ``tokenizers.Tokenizer`` (the Rust library's) does not, and would fail at the first drawing."""
    if tokenizer is None or callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
        return
    kind = f"{type(tokenizer).__module__}.{type(tokenizer).__name__}"
    if callable(getattr(tokenizer, "id_to_token", None)):
        raise ValueError(
            f"TextTokens(tokenizer=<{kind}>): a raw tokenizers.Tokenizer cannot name its ids here; wrap it, "
            "TextTokens(tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=..., "
            "mask_token=...)), or give its vocabulary, TextTokens(vocab=[tokenizer.id_to_token(i) for i in "
            "range(tokenizer.get_vocab_size())], pad_id=..., special_ids=[...])")
    raise ValueError(f"TextTokens(tokenizer=<{kind}>): give a Hugging Face tokenizer (with convert_ids_to_tokens) or "
                     "its name, or vocab=[...] (id -> string)")
