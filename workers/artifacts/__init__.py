"""Artifacts on the node side: manifests, verification, chunked uploads and input materialization."""
