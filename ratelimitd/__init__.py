"""ratelimitd: a Cython-accelerated drop-in replacement for envoyproxy/ratelimit."""

__version__ = "0.1.0"
