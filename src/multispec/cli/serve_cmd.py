"""`multispec serve`: the OpenAI-compatible server (multispec.serve).

Start-up refuses, in one line and before the models load where it can, what would fail every request: a port in
use, a chat template that does not parse or does not render a minimal conversation, method settings that do not
validate. Signals: the first Ctrl-C or SIGTERM stops accepting connections and drains the requests in flight for at
most --drain-timeout seconds (default 30); then, or at once on a second Ctrl-C, every request still in flight is
answered with an OpenAI error object (503, code `shutting_down`) and its generation thread stops at its next
committed token.

--ray: the same app as N replicas on a Ray cluster (multispec.serve.ray; docs/deploy.md): a new single-machine
cluster on the loopback address, or an existing one (--ray-address). The models load in the replicas, not here.
"""
import errno
import socket
from pathlib import Path

import click

from multispec.cli import cli
from multispec.cli.method_options import check_method_options, collect_method_options, method_options
from multispec.decoding.methods import method_names
from multispec.errors import MultispecError, check

DRAIN_TIMEOUT_S = 30.0
FORCE_GRACE_S = 0.3  # after stop_all, time for the error replies to go out before uvicorn force-quits


@cli.command("serve")
@click.option("--target", help="Target model: a local Hugging Face directory or a .gguf file (default: the "
              "embedded default pair).")
@click.option("--draft", help="Draft model: a directory or a .gguf file (another tokenizer: see --cross-vocab).")
@click.option("--cross-vocab", type=click.Choice(["tli", "uag"]), help="A draft with another tokenizer: tli "
              "(default) drafts the tokens both vocabularies share; uag re-encodes the draft's text with the target's "
              "tokenizer (chains only). docs/cross_vocab.md")
@click.option("--method", type=click.Choice(method_names()), default=None,
              help="Decoding method (default: multispec.generate's default).")
@method_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--served-model-name", help="The `model` id clients use (default: the target directory's name).")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=2, show_default=True,
              help="Generations in flight at once (each owns its KV caches).")
@click.option("--max-batch", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Continuous batching: sequences decoded together, one batched forward per step (the fast "
              "backend; replaces --max-concurrent). 1: each generation runs its own forwards.")
@click.option("--max-queue", type=click.IntRange(min=0), default=32, show_default=True,
              help="Admitted requests waiting for a slot; beyond it, HTTP 429 with Retry-After.")
@click.option("--max-model-len", type=click.IntRange(min=1),
              help="Most tokens (prompt + output) a request may take; the batch slots' caches are sized for it. "
              "Default: what fits a share of the memory available at start-up (docs/serve.md), at most the model's "
              "positions; the start-up line says which.")
@click.option("--api-key", envvar="MULTISPEC_API_KEY", show_envvar=True,
              help="Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize (401 otherwise); only "
              "/health and /metrics stay open.")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds from arrival (queueing included) before a request is cancelled.")
@click.option("--chat-template", type=click.Path(exists=True, dir_okay=False),
              help="Jinja chat template file (default: the tokenizer's; chat requests get 400 when it has none).")
@click.option("--device")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "int8", "int4", "w4a8"]))
@click.option("--backend", type=click.Choice(["hf", "fast", "compiled"]),
              help="hf: any transformers causal LM; fast: static-cache Llama-family backend; compiled: the fast "
              "backend with torch.compile'd steps (compiled at start-up, before the port opens). Default: fast where "
              "the models have it, else hf (as generate).")
@click.option("--compile", "compile_", is_flag=True, help="Same as --backend compiled (recommended for servers).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=DRAIN_TIMEOUT_S, show_default=True,
              help="On the first Ctrl-C / SIGTERM, seconds to let requests in flight finish before they are "
              "answered with a 503 error object and stopped.")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads per op (default: torch's choice; "
              "with --ray: per replica, default 1).")
@click.option("--profile", "profile", type=click.Path(exists=True, dir_okay=False), help="Plan from this machine "
              "profile file, read only (default: the cache folder's, updated with what the server observed at exit).")
@click.option("--profile-learning/--no-profile-learning", default=True, show_default=True,
              help="Fold each finished request's draft acceptance into the profile the next requests plan from (in "
                   "memory; each response's spec_decode.profile names the digest its plans came from).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@click.option("--ray", "use_ray", is_flag=True, help="Serve replicas of this server on a Ray cluster through Ray "
              "Serve (pip install 'multispec[ray]'; docs/deploy.md): a new one on this machine (loopback only), or "
              "--ray-address's.")
@click.option("--ray-address", help="With --ray: an existing cluster, HOST:PORT of its head (`ray start --head`), "
              "ray://HOST:PORT or auto. The model paths must exist on every node.")
@click.option("--replicas", type=click.IntRange(min=1), help="With --ray: replicas to run (default 1; with "
              "autoscaling, the starting count).")
@click.option("--min-replicas", type=click.IntRange(min=0), help="With --ray: autoscale, no fewer replicas than "
              "this (on the requests in flight per replica).")
@click.option("--max-replicas", type=click.IntRange(min=1), help="With --ray: autoscale, no more replicas than this.")
def serve_command(target, draft, cross_vocab, method, host, port, served_model_name, max_concurrent, max_batch, max_queue,
                  max_model_len, api_key, request_timeout,
                  chat_template, device, dtype, backend, compile_, drain_timeout, threads, profile, profile_learning,
                  log_level,
                  use_ray, ray_address, replicas, min_replicas, max_replicas, **method_kw):
    """Serve the pair over HTTP with the OpenAI API: /v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics."""
    from multispec.cli.common import decode_text
    from multispec.cli.generate_cmd import _check_proposers

    options = collect_method_options(method_kw)
    config = check_method_options(method, options)  # fail fast, before the models load
    _check_proposers(config, target, draft)
    if method is not None and not config.lossless:
        click.echo(f"warning: {method} with these settings is LOSSY: its output distribution differs from the "
                   "target's", err=True)
    check(not (compile_ and backend not in (None, "compiled")),
          f"--compile runs the compiled fast backend; it cannot be combined with --backend {backend}")
    check(max_batch == 1 or backend != "hf", "--max-batch batches on the fast backend; the transformers backend "
                                             "(--backend hf) runs one sequence per forward: use --max-concurrent")
    check(api_key is None or api_key.strip() != "", "--api-key (or MULTISPEC_API_KEY) is empty; give a key, or "
                                                    "unset it to serve without one")
    backend = "compiled" if compile_ else backend
    template = decode_text(Path(chat_template).read_bytes(), f"the chat template file {chat_template}") \
        if chat_template else None
    check(template is None or template.strip() != "", f"the chat template file {chat_template} is empty")
    if template is not None:
        check_template_syntax(template, chat_template)
    if profile is not None:
        from multispec.profile import MachineProfile

        profile = MachineProfile.load(profile)
    ray_only = [name for name, value in (("--ray-address", ray_address), ("--replicas", replicas),
                                         ("--min-replicas", min_replicas), ("--max-replicas", max_replicas))
                if value is not None]
    check(use_ray or not ray_only, f"{', '.join(ray_only)} needs --ray")
    if use_ray:
        from multispec.serve.ray import check_address, require_ray

        require_ray()
        check(min_replicas is None or max_replicas is None or min_replicas <= max_replicas,
              f"--min-replicas {min_replicas} is above --max-replicas {max_replicas}")
        check(max_replicas is None or replicas is None or replicas <= max_replicas,
              f"--replicas {replicas} is above --max-replicas {max_replicas}")
        if ray_address is not None:
            check_address(ray_address)
        else:
            check_port_free(host, port)
        settings = dict(model_name=served_model_name, method=method, method_options=options, backend=backend,
                        max_concurrent=max_concurrent, max_queue=max_queue, max_batch=max_batch,
                        request_timeout=request_timeout, chat_template=template, max_model_len=max_model_len,
                        api_key=api_key, profile=profile, profile_learning=profile_learning)
        load = dict(device=device, dtype=dtype, cross_vocab=cross_vocab, compile=backend == "compiled")
        serve_on_ray(target, draft, load, settings, host, port, ray_address, replicas, min_replicas, max_replicas,
                     threads)
        return
    check_port_free(host, port)
    if threads is not None:
        import torch

        from multispec.threads import check_thread_count

        torch.set_num_threads(check_thread_count(threads))
    from multispec.api import load_pair
    from multispec.serve import ServeSettings, create_app, uvicorn_config

    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype, cross_vocab=cross_vocab, compile=backend == "compiled")
    check(max_batch == 1 or pair.cross_vocab is None, "--max-batch: a draft with another tokenizer drafts one "
                                                       "sequence at a time; use --max-concurrent")
    if backend is None and max_batch > 1:  # (None: the workers' Decoders take the default, fast where it runs)
        from multispec.decoding.batch import batch_backend

        backend = batch_backend(pair)
        check(backend != "hf", "--max-batch needs the fast backend, which this model does not have "
                               "(docs/compat.md); use --max-concurrent")
    if template is not None:
        check_template_renders(pair.tokenizer, template, chat_template)
    name = served_model_name or Path(pair.target_path).name
    settings = ServeSettings(model_name=name, method=method, method_options=options, backend=backend,
                             max_concurrent=max_concurrent, max_queue=max_queue, max_batch=max_batch,
                             request_timeout=request_timeout, chat_template=template, max_model_len=max_model_len,
                             api_key=api_key, profile=profile, profile_learning=profile_learning)
    app = create_app(pair, settings)  # builds the workers' Decoders: the method is checked against the pair here
    click.echo(app.state.cache_report, err=True)
    bos = pair.tokenizer.bos_token_id
    # One short generation before the port opens: it warms the first call up.
    warm = app.state.scheduler.decoder.generate([bos if bos is not None else 0], max_new_tokens=2, temperature=0.0)
    click.echo(f"serving {name} ({warm.stats['method']}{'' if warm.stats['lossless'] else ', LOSSY'}) on "
               f"http://{host}:{port}/v1", err=True)
    config = uvicorn_config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=drain_timeout + 5 * FORCE_GRACE_S)
    _Server(config, app, drain_timeout).run()


def serve_on_ray(target, draft, load: dict, settings: dict, host: str, port: int, address: str | None,
                 replicas: int | None, min_replicas: int | None, max_replicas: int | None, threads: int | None) -> None:
    """Start the replicas (each loads the pair and warms up), print where they serve, and wait for Ctrl-C or
    SIGTERM; then remove the app, and stop the cluster when this command started it."""
    import time

    import ray
    from ray import serve

    from multispec.serve import ray as ray_serve

    import signal
    import threading

    previous = signal.getsignal(signal.SIGTERM)
    ray_serve.init(address)
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)  # ray.init's handler exits at once; ours stops Serve and Ray first
    try:
        app = ray_serve.deployment(target, draft, load=load, settings=settings, replicas=replicas or 1,
                                   min_replicas=min_replicas, max_replicas=max_replicas, threads=threads or 1)
        ray_serve.run(app, host=host, port=port)
        bounds = ray_serve.autoscaling_bounds(replicas or 1, min_replicas, max_replicas)
        scaling = "" if bounds is None else f" (autoscaling between {bounds[0]} and {bounds[1]})"
        click.echo(f"serving {replicas or 1} replica(s){scaling} on Ray Serve at http://{host}:{port}/v1", err=True)
        while True:
            time.sleep(1.0)
    finally:
        if address is None:
            serve.shutdown()
            ray.shutdown()
        else:  # a cluster of others: only this app goes
            serve.delete("multispec")
            ray.shutdown()  # disconnects this driver


def check_template_syntax(template: str, path: str) -> None:
    """Refuse a chat template that Jinja cannot parse (before the models load)."""
    import jinja2

    try:  # compiled as transformers compiles it (its extensions, e.g. {% generation %}, and filters)
        from transformers.utils.chat_template_utils import _compile_jinja_template as compile_template
    except ImportError:  # another transformers version: Jinja's own checks (unknown tags and filters included)
        compile_template = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).from_string
    try:
        compile_template(template)
    except jinja2.TemplateSyntaxError as e:
        raise MultispecError(f"the chat template {path} does not parse: line {e.lineno}: {e.message}") from None


def check_template_renders(tokenizer, template: str, path: str) -> None:
    """Refuse a chat template that cannot render a minimal conversation (one system and one user message)."""
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"}]
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - Jinja and transformers raise many error types
        message = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise MultispecError(f"the chat template {path} cannot render a minimal conversation: {message}") from None
    check(isinstance(text, str) and text.strip() != "",
          f"the chat template {path} renders a minimal conversation as empty text")


def check_port_free(host: str, port: int) -> None:
    """Bind (host, port) once, as uvicorn will, so that a port in use or a bad host is refused before the models
    load. Port 0 (any free port) always passes."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise MultispecError(f"--host {host!r}: cannot resolve it ({e})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise MultispecError(f"port {port} on {host} is already in use; choose another with --port") \
                    from None
            raise MultispecError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server with a bounded drain: see the module docstring."""

        def __init__(self, config, app, drain_s: float):
            super().__init__(config)
            self.app, self.drain_s, self._drain_timer = app, drain_s, None

        def handle_exit(self, sig, frame) -> None:
            import asyncio

            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is None or not self.should_exit:  # the first signal: drain, then stop what is left
                super().handle_exit(sig, frame)
                if loop is not None:
                    self._drain_timer = loop.call_later(self.drain_s, self._stop_all, loop)
                return
            self._captured_signals.append(sig)  # the second: answer and stop everything now, then quit
            self._stop_all(loop)

        def _stop_all(self, loop) -> None:
            stopped = self.app.state.stop_all()
            if stopped:
                click.echo(f"stopped {stopped} request(s) in flight (answered with 503 shutting_down)", err=True)
            loop.call_later(FORCE_GRACE_S, setattr, self, "force_exit", True)

    return Server


def _Server(config, app, drain_s: float):  # noqa: N802 - a class made on first use (uvicorn imported late)
    return _server_class()(config, app, drain_s)
