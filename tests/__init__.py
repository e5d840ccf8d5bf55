"""The test suite, laid out like the package: ``tests/<folder>/`` tests ``lightning_gae/<folder>/`` (``engine/``, ``lrp/``,
``language/``, ``modalities/``, ``attribution/``, ``metrics/``, ``display/``, ``tensorboard/``, ``callbacks/``), and
``recipes/`` tests the repository's ``recipes/``. A test module is named after the module it tests
(``tests/engine/test_rules.py`` tests ``lightning_gae/engine/rules.py``) or after a concern of its folder
(``tests/callbacks/test_isolation.py``); the top-level module ``compare.py``, the command (``cli/``, by
``test_cli*.py``) and what spans the repository (layout, README, wheel, benchmarks) are tested at the top. Shared helpers live in ``tests/helpers/``
(fixtures in ``tests/conftest.py``); ``tests/test_layout.py`` checks that every folder's test modules name a module or
a listed concern.

The directories are packages so that test modules may share basenames and import the helpers as
``tests.helpers``; pytest puts the repository root on ``sys.path`` (as does ``pythonpath`` in pyproject.toml).
"""
