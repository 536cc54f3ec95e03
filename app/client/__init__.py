"""What the CLI's client commands use to talk to a TunePlane server over HTTP."""
