"""Fleet files: `bettercompute apply` and `export` (ADR 0005)."""
