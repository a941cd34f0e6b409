"""Shared pytest set-up: every module in tests/fixtures/ is a fixture plugin owned by one area
(rpc, emulated, tracker, ...), so areas add fixtures without editing this file."""
import pathlib

# prereq first: the other fixture modules import it, and pytest can only assert-rewrite a plugin it imports itself.
pytest_plugins = sorted(
    ("fixtures." + p.stem for p in (pathlib.Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"),
    key=lambda name: (name != "fixtures.prereq", name),
)
