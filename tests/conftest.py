"""Session-wide test configuration; integration fixtures live in tests/integration/conftest.py."""
