"""Shared pytest set-up: every module in tests/fixtures/ is a fixture plugin owned by one area
(rpc, emulated, tracker, ...), so areas add fixtures without editing this file."""
import pathlib

pytest_plugins = sorted(
    "fixtures." + p.stem for p in (pathlib.Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)
