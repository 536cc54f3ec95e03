"""The runner (`tuneplane runner`, one process per member, started by the agent in its own session):
`runtime` checks the pinned runtime, `environment` builds the workload's environment and command,
`process` runs it, keeps logs and writes the exit status file."""
