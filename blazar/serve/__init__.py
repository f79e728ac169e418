"""The inference service: what a request does between its HTTP route and the runtime.

``blazar.web`` decodes a request, builds its context (``serve.context.Ask``) and calls
in here; this package runs it on the runtime (``actors``) and hands back neutral
results or dialect bytes. It never imports quart, hypercorn or ``blazar.web`` and never
reads a context variable: everything about the request it serves is passed in.
"""
