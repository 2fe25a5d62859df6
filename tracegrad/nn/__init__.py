"""Neural-network building blocks written on the public API."""
from . import functional  # noqa: F401
