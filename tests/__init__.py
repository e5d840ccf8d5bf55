"""The test suite, laid out like the package: ``callbacks/``, ``metrics/``, ``tensorboard/``, ``recipes/`` and one
``test_<module>.py`` per engine module. Shared helpers live in ``tests/helpers/`` (fixtures in ``tests/conftest.py``).

The directories are packages so that test modules may share basenames and import the helpers as
``tests.helpers``; pytest puts the repository root on ``sys.path`` (as does ``pythonpath`` in pyproject.toml).
"""
