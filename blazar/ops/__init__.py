"""Operator tools the CLI runs over the daemon's data: recommendations from the ledger
(``autopilot``), snapshots of a home (``snapshot``), and how the install upgrades itself
(``upgrade``).
"""
