"""hvlrun tests (a package so that this conftest does not shadow tests/conftest.py)."""
