"""The Python API (placeholder for the pipeline)."""
