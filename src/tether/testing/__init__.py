"""Test helpers for projects that run their tests on tether devices (see :mod:`tether.testing.pytest_plugin`)."""
