"""Blazar: a control plane for local AI inference."""

__version__ = "0.1.0"
