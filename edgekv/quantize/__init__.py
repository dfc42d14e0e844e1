"""edgekv quantize."""
