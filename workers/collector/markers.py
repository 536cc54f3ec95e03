"""The files in a collector's spool directory through which whoever started it (the node agent, the Slurm
step) and the collector speak at a member's end. Their own module: the starters import them without the
collector's parsers (numpy, protobuf)."""

MEMBER_EXITED = "member-exited"  # marker the agent writes into the spool directory when the member ended
FINAL_SENT = "final-sent"  # written by the collector once its final batch was acknowledged
# After FINAL_SENT the collector's work is done: whoever started it waits at most this long for it to exit,
# then kills it (its spool holds nothing unacknowledged). The member's end never waits for that exit.
EXIT_GRACE = 2.0
# Tests only: seconds the collector sleeps after FINAL_SENT before exiting (a collector that lingers).
HOLD_EXIT_ENV = "TUNEPLANE_COLLECTOR_TEST_HOLD_EXIT"
