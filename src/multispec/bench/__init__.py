"""`multispec bench`: one harness for every method (multispec's and transformers' assisted generation).

    from multispec.bench import run_bench
    results = run_bench(target="T", draft="D", datasets="humaneval", methods="ar;sd:k=4;hf-assisted",
                        temperatures=(0, 1), limit=20, out="benchmarks/results/x")

See docs/bench.md for the metrics and the output files.
"""
from multispec.bench.report import render, summarize, write_outputs
from multispec.bench.runner import run_bench, step_costs
from multispec.bench.specs import MethodSpec, parse_method_spec, parse_method_specs

__all__ = ["run_bench", "step_costs", "write_outputs", "render", "summarize", "MethodSpec", "parse_method_spec",
           "parse_method_specs"]
