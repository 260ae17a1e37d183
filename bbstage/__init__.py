"""bbstage: data staging for Slurm's burst_buffer/lua plugin."""

__version__ = "0.1.0"
