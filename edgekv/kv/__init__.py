"""The KV cache."""
