"""Probing the GPUs: NVML readings and events, the kernel log, and Xid deduplication."""
