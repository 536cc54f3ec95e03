"""Integration artifacts: the framework-specific code a runner executes for a member.

Each integration is one or more files in this package, pinned by sha256 in every preview
(app/submission/pins.py). They are declared as plugins in `plugins.py` (entry point group
`tuneplane.integrations`) and ship in the wheel so the runner on a node can execute them.
"""
