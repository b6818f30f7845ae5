"""`multispec serve`: an OpenAI-compatible HTTP server over the library (see docs/serve.md).

app.py: endpoints and error objects; protocol.py: pydantic request/response models; scheduler.py: the bounded
queue and the worker threads, each with its own Decoder; metrics.py: Prometheus metrics with vLLM's spec-decode
names; memory.py: --max-model-len and the caches' memory; http.py: uvicorn's config, with a header timeout; ray.py:
replicas of the app on Ray Serve (the optional extra multispec[ray]).
"""
from multispec.serve.app import ServeSettings, create_app
from multispec.serve.http import uvicorn_config

__all__ = ["ServeSettings", "create_app", "uvicorn_config"]
