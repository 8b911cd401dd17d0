"""The per-node GPU health agent."""
