"""HTTP routers: translate HTTP to service calls and back; no Docker or SQL here."""
