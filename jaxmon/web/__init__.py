"""HTTP: the ASGI app and hypercorn server, and the exporter-toolkit web config (TLS, basic auth, headers)."""
