"""tracegrad: trace-and-compile automatic differentiation."""
__version__ = "0.1.0"
