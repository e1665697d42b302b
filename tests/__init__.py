"""kgstream tests (a package so that tests.support is importable)."""
