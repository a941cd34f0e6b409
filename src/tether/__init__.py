"""tether: cross-compile kernels and models for ARM devices; test and benchmark them over RPC."""
__version__ = "0.1.0"
