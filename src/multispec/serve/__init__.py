"""`multispec serve`: an OpenAI-compatible HTTP server over the library (see docs/serve.md).

app.py: endpoints and error objects; protocol.py: pydantic request/response models; scheduler.py: the bounded
queue and the worker threads, each with its own Decoder; metrics.py: Prometheus metrics with vLLM's spec-decode
names.
"""
from multispec.serve.app import ServeSettings, create_app

__all__ = ["ServeSettings", "create_app"]
