"""GGUF files."""
