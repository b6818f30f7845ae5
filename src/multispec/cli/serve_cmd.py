"""`multispec serve`: the OpenAI-compatible server (multispec.serve)."""
from pathlib import Path

import click

from multispec.cli import cli
from multispec.cli.method_options import check_method_options, collect_method_options, method_options
from multispec.errors import check
from multispec.decoding.methods import method_names


@cli.command("serve")
@click.option("--target", help="Target model: local Hugging Face directory (default: the embedded default pair).")
@click.option("--draft", help="Draft model sharing the target's vocabulary.")
@click.option("--method", type=click.Choice(method_names()), default=None,
              help="Decoding method (default: multispec.generate's default).")
@method_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--served-model-name", help="The `model` id clients use (default: the target directory's name).")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=2, show_default=True,
              help="Generations in flight at once (each owns its KV caches).")
@click.option("--max-queue", type=click.IntRange(min=0), default=32, show_default=True,
              help="Admitted requests waiting for a slot; beyond it, HTTP 429 with Retry-After.")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds from arrival (queueing included) before a request is cancelled.")
@click.option("--chat-template", type=click.Path(exists=True, dir_okay=False),
              help="Jinja chat template file (default: the tokenizer's; chat requests get 400 when it has none).")
@click.option("--device")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--backend", type=click.Choice(["hf", "fast"]), default="hf", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads per op (default: torch's choice).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve_command(target, draft, method, host, port, served_model_name, max_concurrent, max_queue, request_timeout,
                  chat_template, device, dtype, backend, threads, log_level, **method_kw):
    """Serve the pair over HTTP with the OpenAI API: /v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics."""
    options = collect_method_options(method_kw)
    config = check_method_options(method, options)  # fail fast, before the models load
    if method is not None:
        if not config.lossless:
            click.echo(f"warning: {method} with these settings is LOSSY: its output distribution differs from the "
                       "target's", err=True)
    template = Path(chat_template).read_text() if chat_template else None
    check(template is None or template.strip() != "", f"the chat template file {chat_template} is empty")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    import uvicorn

    from multispec.api import load_pair
    from multispec.serve import ServeSettings, create_app

    pair = load_pair(target=target, draft=draft, device=device, dtype=dtype)
    name = served_model_name or Path(pair.target_path).name
    settings = ServeSettings(model_name=name, method=method, method_options=options, backend=backend,
                             max_concurrent=max_concurrent, max_queue=max_queue, request_timeout=request_timeout,
                             chat_template=template)
    app = create_app(pair, settings)  # builds the workers' Decoders: the method is checked against the pair here
    bos = pair.tokenizer.bos_token_id
    # One short generation before the port opens: it warms the first call up.
    warm = app.state.scheduler.decoder.generate([bos if bos is not None else 0], max_new_tokens=2, temperature=0.0)
    click.echo(f"serving {name} ({warm.stats['method']}{'' if warm.stats['lossless'] else ', LOSSY'}) on "
               f"http://{host}:{port}/v1", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
