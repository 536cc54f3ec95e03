"""Processes that act outside the database: backend workers, the node agent, the runner, the collector."""
