"""The methods: one file per method, each registering its facts and rule (:class:`~lightning_gae.methods.Method`), and
:func:`~lightning_gae.explain`, which runs them by those facts.

``registry.py`` holds the registry; ``dispatch.py`` runs ``explain()``; each other module is one method
(``gradients.py``: Captum's four, which share one adapter). Importing this package registers them, in the order
:data:`lightning_gae.METHODS`, :data:`lightning_gae.LRP_METHODS`, ``"random"`` and Captum's methods list them. A user
adds a method with :func:`register_method` (docs/guides/add-a-method.md).
"""

from lightning_gae.engine.forward import RecordedForward
from lightning_gae.methods import (  # noqa: F401  (each registers its method, in this order)
    gae,
    rollout,
    raw_attention,
    attn_gradcam,
    attn_gradcam_vit,
    attention_flow,
    attnlrp,
    transformer_attribution,
    random,
    gradients,
)
from lightning_gae.methods.attention_flow import allow_slow_attention_flow
from lightning_gae.methods.dispatch import explain, explain_methods
from lightning_gae.methods.random import random_attribution
from lightning_gae.methods.registry import (
    ALL_ZERO_DEFAULT,
    KINDS,
    Kind,
    Method,
    get_method,
    method_names,
    methods_of,
    register_method,
    unregister_method,
)

__all__ = [
    "ALL_ZERO_DEFAULT",
    "KINDS",
    "Kind",
    "Method",
    "RecordedForward",
    "allow_slow_attention_flow",
    "explain",
    "explain_methods",
    "get_method",
    "method_names",
    "methods_of",
    "random_attribution",
    "register_method",
    "unregister_method",
]
