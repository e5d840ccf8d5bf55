"""What a test does when an environment it needs from outside cannot be built (LXT's, for the AttnLRP agreement tests).

On a developer's machine it skips with the reason; under ``CI=true`` (set by GitHub Actions, GitLab CI and
``.ci/run``) it fails with it, because a skipped agreement test checks nothing and CI would pass without it.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def on_ci() -> bool:
    """Whether the tests run in CI: the environment variable ``CI`` is ``true`` (any case)."""
    return os.environ.get("CI", "").strip().lower() == "true"


def environment_missing(reason: str) -> NoReturn:
    """Skip the test with ``reason``; under ``CI=true`` fail it with ``reason`` instead."""
    if on_ci():
        pytest.fail(f"{reason} (CI=true: a test that cannot run fails here instead of skipping)", pytrace=False)
    pytest.skip(reason)
