"""Blazar's serving runtime: supervised actors for engines, slots and state."""
