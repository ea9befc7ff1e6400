"""Small helpers shared across the package (no heavy imports at package import time)."""
