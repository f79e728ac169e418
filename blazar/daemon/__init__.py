"""The daemon as a process: starting it (``serve``), the files that find it (``files``: its
address, pid and local token) and the client the CLI talks to it with (``client``).
"""
