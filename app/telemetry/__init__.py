"""Telemetry on its own path: the batch wire format, the gateway, ingest, bounded queries, tokens."""
