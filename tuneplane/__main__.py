"""`python -m tuneplane …`: the same commands as the `tuneplane` script."""

from tuneplane.app.cli import main

main()
