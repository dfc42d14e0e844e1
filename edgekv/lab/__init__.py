"""Measuring tools."""
