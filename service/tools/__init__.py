"""Operator and evaluation tools, not the request path.

The simulator (``sim/``: a leaky paged-KV engine, its OpenAI front, a gateway and traffic), the
demo (``demo/``), ``probe.py`` (canary probes and allowlist imports) and ``replay.py`` (a JSON
Lines traffic file through the SDK) are what operators and evaluators run against a service;
the API and the workers never need them. So nothing under ``service/`` outside this package
imports them, except the command line (``service/cli.py``), which dispatches ``bleedwatch sim``,
``demo``, ``replay``, ``canary`` and ``allowlist`` to them; tests/test_tools_boundary.py holds
that rule.
"""
