"""The telemetry collector: tails a member's TensorBoard and JSONL output, spools batches durably on
host-local disk and ships them to the telemetry gateway. It never talks to the node control channel."""
