"""Environments: the interface every benchmark implements (``base``), the benchmark API and its registry
(``benchmarks``), the helpers every transition check shares (``checks``), B.1's response format
(``response_format``), environments in worker processes (``workers``), and one package per benchmark (``alfworld``,
``scienceworld``, ``webshop``, ``search``: its config and default config file, environment and transition type, its
check's own conditions, prompt templates and ``Benchmark``)."""
