"""`specc bench`: time an engine against Hugging Face and compiled baselines.

`command.run_bench` is the CLI verb; `harness.benchmark` does the work and
returns one JSON-ready document that the report, the chart and
`benchmarks/run_all.py` all read.
"""
