"""The gateway's middleware: the steps every request passes through before and after
its route, each in a module of its own.

``GatewayMiddleware.__call__`` (``blazar.web.asgi.gateway``) runs them and says their order.
"""
