"""The Slurm backend: its worker, the Slurm command-line wrapper and the job steps (docs/slurm.md)."""
