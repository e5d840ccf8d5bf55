"""Tabular data, FT-Transformer style: one token per feature, drawn as a table, removed by the feature's mean."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_gae import display
from lightning_gae._structures import input_tensor, replace_input
from lightning_gae.modalities.regions import Region
from lightning_gae.modalities.tokens import InterpolateMode, MethodMap, Modality, spread

__all__ = ["TabularTokens"]


class TabularTokens(Modality):
    """Tabular data, FT-Transformer style: ``prefix_tokens`` then one token per feature.

    Args:
        feature_names: one name per feature, in token order.
        prefix_tokens: tokens before the features (1 for a CLS token).
        means: the value a removed feature takes, one per feature: its mean over the training
            data, in the scale the model sees (:meth:`fit` computes them). Without it, mapping
            and drawing work, but the faithfulness metrics cannot remove features.

    Example:
        >>> import torch
        >>> train_features = torch.tensor([[30.0, 1.0, 170.0], [50.0, 3.0, 180.0]])
        >>> modality = TabularTokens(["age", "income", "height"]).fit(train_features)
        >>> modality.means
        (40.0, 2.0, 175.0)
        >>> modality.to_input(torch.rand(2, 1 + 3), train_features).shape   # token relevance -> one per feature
        torch.Size([2, 3])
    """

    # Samples may carry the informative features [B, F] (a synthetic table): the relevance is scored by how it recovers them.
    ground_truth = "feature_recovery"

    def __init__(self, feature_names: Sequence[str], prefix_tokens: int = 1, means: Sequence[float] | None = None) -> None:
        if prefix_tokens < 0:
            raise ValueError(f"prefix_tokens must be >= 0; got {prefix_tokens}")
        if means is not None and len(means) != len(feature_names):
            raise ValueError(f"means has {len(means)} values for {len(feature_names)} feature_names")
        self.feature_names = list(feature_names)
        self.prefix_tokens = prefix_tokens
        self.means = None if means is None else tuple(float(m) for m in means)

    def __repr__(self) -> str:
        return f"TabularTokens({len(self.feature_names)} features, prefix_tokens={self.prefix_tokens})"

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        return x.dim() == 2 and x.shape[1] == len(self.feature_names) == num_tokens - self.prefix_tokens

    def fit(self, features: Tensor) -> TabularTokens:
        """Set ``means`` to the column means of the training features ``[n, F]`` (as the model sees them); returns self.

        A fixed fill makes a removed feature mean the same in every batch: the batch's own mean
        would leave a batch of one unperturbed and make scores depend on the batch size.
        """
        features = self._features(features)
        self.means = tuple(float(m) for m in features.detach().cpu().double().mean(dim=0))
        return self

    def to_input(self, tokens: Tensor, inputs: Any = None) -> Tensor:
        """Relevance per feature.

        Args:
            tokens: ``[B, N]`` token relevance, ``N = prefix_tokens + F``.
            inputs: the features (not needed to map; accepted so every modality is called alike).

        Returns:
            float32 ``[B, F]``.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, N]; got shape {tuple(tokens.shape)}")
        if inputs is not None:
            self._features(inputs)
        count = tokens.shape[1] - self.prefix_tokens
        if count != len(self.feature_names):
            raise ValueError(
                f"{tokens.shape[1]} tokens minus prefix_tokens={self.prefix_tokens} leave {count} features, but "
                f"feature_names has {len(self.feature_names)}: {self.feature_names}"
            )
        return tokens[:, self.prefix_tokens :].float()

    def _features(self, inputs: Any) -> Tensor:
        """The features among ``inputs``: the tensor itself, or the one a person looks at among keyword or tuple inputs."""
        features = input_tensor(inputs)
        count = len(self.feature_names)
        if isinstance(features, Tensor) and features.dim() > 2 and features.shape[1] == count:
            raise ValueError(f"TabularTokens({count} feature_names) draws and removes one value per feature, so it needs "
                             f"features [B, {count}]; got {list(features.shape)}. Give the model one value per feature "
                             "(make each feature's vector inside its forward), or write a lightning_gae.Modality of your own")
        if not isinstance(features, Tensor) or features.dim() != 2 or features.shape[1] != count:
            raise ValueError(f"TabularTokens needs features [B, {count}] (a tensor, or the first among keyword or "
                             f"tuple inputs); got {list(getattr(features, 'shape', [])) or type(features).__name__}")
        return features

    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """One score per feature ``[B, F]``, from token relevance ``[B, prefix + F]`` or a map ``[B, F]``."""
        features = self._features(inputs)
        if attributions.shape == features.shape:
            return attributions.float()
        return self.to_input(attributions, inputs)

    def removable(self, inputs: Any) -> Tensor:
        """Every feature."""
        return torch.ones_like(self._features(inputs), dtype=torch.bool)

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """Dropped features take ``means`` (or ``fill``'s values).

        Raises:
            ValueError: without ``means`` or ``fill`` (the message says how to give them).
        """
        features, fill = self._features(inputs), None if fill is None else self._features(fill)
        if fill is None:
            if self.means is None:
                raise ValueError("TabularTokens has no value to put in place of a removed feature: pass "
                                 "means=[...] (the training set's feature means, in the scale the model sees) "
                                 "or call modality.fit(train_features)")
            fill = torch.tensor(self.means).to(features)
        return replace_input(inputs, features, torch.where(drop.to(features.device), fill, features))

    # --- what the rest of the package asks (Modality's hooks) -----------------------------------

    @property
    def can_remove(self) -> bool:
        """Only with ``means`` (or a ``fill``)."""
        return self.means is not None

    def relevance_on(self, x: Tensor, tokens: Tensor, mode: InterpolateMode = "nearest") -> Tensor | None:
        """One value per feature, on every entry of a feature; None for an input of another width."""
        if x.dim() < 2 or x.shape[1] != len(self.feature_names):
            return None
        return spread(self.to_input(tokens, x), x)

    def region_tokens(self, region: Region, inputs: Any) -> Tensor:
        """The tokens of ``features`` (indices or names)."""
        features = inputs
        if region.features is None:
            raise region.mismatch(self, "features= (indices or names of the features)")
        names = self.feature_names
        if not isinstance(features, Tensor) or features.dim() != 2 or features.shape[1] != len(names):
            raise ValueError(f"TabularTokens regions need features [B, {len(names)}]; "
                             f"got {getattr(features, 'shape', type(features).__name__)}")
        index = []
        for f in region.features:
            if isinstance(f, str):
                if f not in names:
                    raise ValueError(f"Region {region.name!r}: feature {f!r} is not one of feature_names {names}")
                index.append(names.index(f))
            elif not 0 <= f < len(names):
                raise ValueError(f"Region {region.name!r}: feature index {f} is out of range for {len(names)} features")
            else:
                index.append(f)
        inside = torch.zeros(features.shape[0], self.prefix_tokens + len(names), dtype=torch.bool, device=features.device)
        inside[:, [self.prefix_tokens + i for i in index]] = True
        return inside

    def picture(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None, header: str,
                panel_px: int, alpha: float) -> np.ndarray:
        """A table: a row per feature (``name = value``), a coloured column per method."""
        columns = [(m.method, m.values, m.vrange) for m in maps]
        return display.feature_table(self.feature_names, columns, values=x.float().numpy(), header=header)

    def panels(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None,
               panel_px: int, alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """The feature count, and a one-column table per method."""
        cells = [display.feature_table(self.feature_names, [(m.method, m.values, m.vrange)], values=x.float().numpy())
                 for m in maps]
        return display.text_line(f"{len(self.feature_names)} features"), cells

    def table_units(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None) -> tuple[str, list[str]] | None:
        """A row per feature, ``name = value``."""
        return "feature", [f"{n} = {v:.4g}" for n, v in zip(self.feature_names, x.float().tolist())]

    def dashboard_input(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None,
                        count: int) -> tuple[dict[str, Any], np.ndarray]:
        """The feature values and names."""
        fields = {"modality": "tabular", "prefix_tokens": self.prefix_tokens, "feature_names": self.feature_names}
        return fields, x.double().numpy()

    def render(self, x: Tensor | None, relevance: Tensor | None, title: str, *, signed: bool | None = None) -> np.ndarray:
        """Bars of relevance ``[F]`` per feature (None: no bars), labelled ``name = value`` from ``x [F]`` (or None).

        The axis spans :func:`~lightning_gae.display.value_range` (``signed`` as :meth:`Modality.render`), and each
        bar takes its value's colour on :func:`~lightning_gae.display.colormap_for` it.

        Returns:
            uint8 ``[h, w, 3]``.
        """
        values = None
        if x is not None:
            values = x.detach().float().cpu().reshape(-1)
            if values.numel() != len(self.feature_names):
                raise ValueError(f"TabularTokens({len(self.feature_names)} feature_names) draws one value per feature; "
                                 f"got {list(x.shape)}")
        lengths = torch.zeros(len(self.feature_names)) if relevance is None else relevance.detach().float().cpu()
        vmin, vmax = display.value_range(lengths, signed)
        return display.feature_bars(self.feature_names, lengths, title, values=values, vrange=(vmin, vmax),
                                    cmap=display.colormap_for(vmin < 0))
