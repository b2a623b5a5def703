"""The `fasterfs` command."""
