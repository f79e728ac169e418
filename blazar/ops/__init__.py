"""Operator tools the CLI runs over the daemon's data: recommendations from the ledger
(``autopilot``) and snapshots of a home (``snapshot``).
"""
