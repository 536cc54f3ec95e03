"""The importable face of TunePlane for workloads (`from tuneplane import sdk`)."""
