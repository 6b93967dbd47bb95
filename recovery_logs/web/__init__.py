"""Web console (``recovery-logs serve``): Starlette + uvicorn, server-rendered pages, users and
roles, CSRF-protected forms, a Bearer-token JSON API. Optional: ``pip install 'recovery-logs[web]'``."""
