"""Tiny models."""
