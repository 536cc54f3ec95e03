"""The Node agent (`tuneplane node`): dials out to the node gateway, reports capacity, runs commands.

Modules: `state` (state and work directories, the credential file), `capacity` (what this machine has),
`handlers` (command kind -> handler registry, extended by the launch code), `session` (one control
connection), `main` (enrollment, reconnect with backoff and jitter).
"""
