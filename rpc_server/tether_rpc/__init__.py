"""The device half of tether: protocol, runtime and device server (stdlib + numpy + msgpack only)."""
__version__ = "0.1.0"
