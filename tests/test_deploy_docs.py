"""docs/deploy.md: its Kubernetes manifest parses as YAML, with the InferencePool API version the Gateway API
Inference Extension documents, and every `vllm:` metric name it promises is one the server exports."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

yaml = pytest.importorskip("yaml")

DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"


def _yaml_documents() -> list[dict]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert blocks, "no yaml block in docs/deploy.md"
    return [d for block in blocks for d in yaml.safe_load_all(block) if d is not None]


def test_manifest_parses_with_the_documented_inference_pool_version():
    docs = _yaml_documents()
    kinds = {d["kind"]: d for d in docs}
    assert {"Deployment", "Service", "InferencePool"} <= set(kinds)
    pool = kinds["InferencePool"]
    assert pool["apiVersion"] == INFERENCE_POOL_API
    spec = pool["spec"]
    labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()  # the pool selects the Deployment's Pods
    port = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert spec["targetPorts"] == [{"number": port}]
    assert spec["endpointPickerRef"]["name"] and spec["endpointPickerRef"]["port"]["number"] > 0
    args = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["multispec", "serve"] and args[args.index("--port") + 1] == str(port)


def test_metric_names_in_the_doc_are_exported():
    from multispec.serve.metrics import ServerMetrics

    scheduler = SimpleNamespace(running=1, waiting=2, batch=None, on_start=None, cache_usage=lambda: 0.5)
    metrics = ServerMetrics(scheduler, "m")
    metrics.finished({"num_spec_steps": 2, "num_draft_tokens": 4, "num_accepted_draft_tokens": 1,
                      "accepted_per_position": [1, 0]}, 3, 2, "length", 0.1)  # labelled counters show once counted
    text = metrics.text().decode()
    named = set(re.findall(r"`(vllm:[a-z_]+)(?=[`{])", DOC.read_text(encoding="utf-8")))
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= named
    for name in named - {"vllm:gpu_cache_usage_perc"}:  # the old name, quoted as vLLM's, not exported
        assert re.search(rf"^{re.escape(name)}[{{ ]", text, re.MULTILINE), name
    assert 'vllm:num_requests_waiting{model_name="m"} 2.0' in text
    assert 'vllm:kv_cache_usage_perc{model_name="m"} 0.5' in text
