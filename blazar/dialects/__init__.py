"""Sans-io translation between each API dialect's wire bytes and neutral types.

Nothing here imports trio, quart or the runtime: these are pure functions.
"""
