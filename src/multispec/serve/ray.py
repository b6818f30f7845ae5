"""Ray Serve: replicas of `multispec serve`'s app on a Ray cluster (docs/deploy.md).

Each replica is one Ray actor that loads the pair and builds the same FastAPI app as `multispec serve` (create_app:
same endpoints, same outputs, its own scheduler, caches and /metrics); Serve's proxy spreads requests over the
replicas, queues what exceeds their `max_ongoing_requests` (a replica's generations + --max-queue) and, with
autoscaling bounds, adds or removes replicas to keep about `target_ongoing_requests` in flight on each. A replica
whose health check fails (its batch loop died) or whose process dies is replaced by the controller; the requests
it was answering fail (a server error from the proxy) and are the client's to retry.

Ray is an optional extra (`pip install 'multispec[ray]'`): this module imports without it, and `require_ray`
refuses in one line.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

from multispec.errors import MultispecError, check

PROXY_READY_S = 30  # seconds a new local cluster's HTTP proxy has to report ready (Ray's default: 5)
RAY_EXTRA = "pip install 'multispec[ray]' (ray[serve]==2.60.0)"


def require_ray():
    """(ray, ray.serve), or a one-line refusal when the extra is not installed."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise MultispecError(f"--ray needs Ray Serve, which is not installed: {RAY_EXTRA}") from None
    return ray, serve


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse, in one line, a cluster address nothing answers at (a TCP connect to its host and port), so that
    ray.init does not retry it for a minute. "auto" and "local" are Ray's to resolve."""
    if address in ("auto", "local"):
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    check(sep == ":" and host != "" and port.isdigit() and 0 < int(port) < 65536,
          f"--ray-address {address!r}: give HOST:PORT (the head's GCS port, 6379 by default), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise MultispecError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e}); start one "
                             "with `ray start --head` or check the address") from None


def init(address: str | None = None, **kwargs) -> Any:
    """ray.init with usage stats off: an existing cluster (address; checked first: check_address) or a new
    single-machine one on the loopback address with no dashboard. Ray turns 127.0.0.1 into the machine's network
    address unless its single-machine mode is on (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read by Ray and inherited by
    the processes it starts): it is set here, so that the local cluster's every process listens and talks on
    127.0.0.1 only. A new cluster gives its HTTP proxy PROXY_READY_S to report ready (Ray's 5 s: on a busy two-core
    machine the proxy missed it three times and was killed before it ran). kwargs go to ray.init (num_cpus,
    object_store_memory, ...)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None:
        check_address(address)
        ray, _ = require_ray()
        try:
            return ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:  # no cluster for "auto", a version mismatch, ...
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MultispecError(f"--ray-address {address}: cannot join the cluster ({why})") from None
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_S))  # (its processes read it)
    ray, _ = require_ray()
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time; the env variable covers a Ray imported earlier
    return ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", **kwargs)


def build_app(load: dict, settings: dict, threads: int | None = None):
    """One replica's app, built as `multispec serve` builds it: torch's threads, the pair (load_pair(**load)), the
    backend's default (fast when batching), the served name (default: the target folder's), create_app, and one
    short generation that warms the first call up."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from multispec.api import load_pair
    from multispec.serve.app import create_app
    from multispec.serve.edge import ServeSettings

    pair = load_pair(**load)
    settings = dict(settings)
    if settings.get("backend") is None and settings.get("max_batch", 1) > 1:  # (None: the Decoder's default)
        from multispec.decoding.batch import batch_backend

        settings["backend"] = batch_backend(pair)
    if not settings.get("model_name"):
        settings["model_name"] = Path(pair.target_path).name
    app = create_app(pair, ServeSettings(**settings))
    bos = pair.tokenizer.bos_token_id
    app.state.scheduler.decoder.generate([bos if bos is not None else 0], max_new_tokens=2, temperature=0.0)
    return app


def settings_dict(settings: Any) -> dict:
    """A ServeSettings (or a dict of its fields) as a plain dict for the replicas (its profile kept as it is)."""
    if settings is None:
        return {}
    if dataclasses.is_dataclass(settings):
        return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return dict(settings)


_REPLICA = None


def replica_class():
    """The Serve deployment class (made once, on first use: Ray is imported late). Its init args: load (load_pair's
    keyword arguments), settings (ServeSettings fields), threads (torch's, per replica)."""
    global _REPLICA
    if _REPLICA is None:
        _, serve = require_ray()

        @serve.deployment(name="multispec")
        @serve.ingress()
        class MultispecReplica:
            def __init__(self, load: dict, settings: dict, threads: int | None = None):
                self.multispec_app = build_app(load, settings, threads)

            def __serve_build_asgi_app__(self):
                return self.multispec_app

            def check_health(self) -> None:
                """Serve's periodic health check: a replica whose batch loop died is replaced."""
                if not self.multispec_app.state.scheduler.alive():
                    raise RuntimeError("the batch loop has stopped")

        _REPLICA = MultispecReplica
    return _REPLICA


def autoscaling_bounds(replicas: int, min_replicas: int | None, max_replicas: int | None) -> tuple[int, int] | None:
    """(min, max) replicas when either bound is given (min default 1, max default max(min, replicas)), else None."""
    if min_replicas is None and max_replicas is None:
        return None
    lo = 1 if min_replicas is None else min_replicas
    hi = max(lo, replicas) if max_replicas is None else max_replicas
    check(0 <= lo <= hi and hi >= 1,
          f"autoscaling needs 0 <= min_replicas <= max_replicas and max_replicas >= 1, got {lo} and {hi}")
    return lo, hi


def deployment(target: str | None = None, draft: str | None = None, *, load: dict | None = None,
               settings: Any = None, replicas: int = 1, min_replicas: int | None = None,
               max_replicas: int | None = None, threads: int | None = 1, target_ongoing_requests: float | None = None,
               health_check_period_s: float = 10.0, health_check_timeout_s: float = 30.0, name: str = "multispec",
               ray_actor_options: dict | None = None):
    """A Ray Serve application of `replicas` replicas of multispec's server (`serve.run(deployment(...),
    route_prefix="/")`). target, draft: model paths every node can read (None, None: the embedded default pair);
    load: further load_pair keyword arguments (device, dtype, cross_vocab, compile); settings: a ServeSettings or
    a dict of its fields (model_name defaults to the target folder's name). min_replicas / max_replicas: autoscaling
    between them (replicas is the starting count, clipped into them), aiming at target_ongoing_requests per replica
    (default: its generations at once). threads: torch threads per replica, also its Ray CPUs (num_cpus)."""
    _, serve = require_ray()
    check(isinstance(replicas, int) and replicas >= 1, f"replicas must be at least 1, got {replicas!r}")
    check(threads is None or threads >= 1, f"threads must be at least 1, got {threads!r}")
    bounds = autoscaling_bounds(replicas, min_replicas, max_replicas)
    fields = settings_dict(settings)
    generations = fields.get("max_batch", 1) if fields.get("max_batch", 1) > 1 else fields.get("max_concurrent", 2)
    options: dict[str, Any] = {
        "name": name,
        "max_ongoing_requests": generations + fields.get("max_queue", 32),  # beyond it Serve queues, not a 429
        "health_check_period_s": health_check_period_s,
        "health_check_timeout_s": health_check_timeout_s,
        "ray_actor_options": {"num_cpus": threads or 1, **(ray_actor_options or {})},
    }
    if bounds is not None:
        lo, hi = bounds
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi,
                                         "initial_replicas": min(max(replicas, lo), hi),
                                         "target_ongoing_requests": target_ongoing_requests or generations}
    else:
        options["num_replicas"] = replicas
    pair = {"target": target, "draft": draft, **(load or {})}
    return replica_class().options(**options).bind(pair, fields, threads)


def run(app, host: str = "127.0.0.1", port: int = 8000, name: str = "multispec", blocking: bool = False):
    """serve.run with Serve's HTTP proxy on host:port and the app at "/" (the OpenAI paths as `multispec serve`
    has them). Returns the app's handle; Serve's proxy is then up."""
    _, serve = require_ray()
    serve.start(http_options={"host": host, "port": port})
    try:
        return serve.run(app, name=name, route_prefix="/", blocking=blocking)
    except RuntimeError as e:  # a replica's constructor failed (a model path, a method setting): Ray logged why
        raise MultispecError(f"the replicas did not start; their error is in Ray's log above ({str(e).strip()})") \
            from None
