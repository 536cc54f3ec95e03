"""TunePlane control plane: models, database access, HTTP blueprints, gateways and the CLI."""

__version__ = "0.1.0"
