"""The deployment tests use the gateway package's fixtures (a real gateway in front of
simulated engines)."""

from tests.gateway.conftest import start_gateway

__all__ = ["start_gateway"]
