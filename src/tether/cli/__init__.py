"""Command-line interface: `tether` (a group), `rpc-server` and `rpc-tracker`."""
