"""The result files and their safety: the format, files put in place as units, results
streamed as they come, interrupts raised where stopping is clean, and ``ds.probe``."""
