"""Who may call the daemon: the API key store (``keys``), the per-key limits (``limits``), and
what a client of the daemon trusts of its TLS certificate (``trust``).

None is HTTP: the gateway's key step (``blazar.web.middleware.auth``) and the CLI's
``blazar keys`` both use them.
"""
