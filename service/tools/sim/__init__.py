"""A toy multi-tenant inference stack that reproduces the incident, for tests and the demo.

Not part of the service: the API never imports it; only the CLI does, for ``bleedwatch sim``
and ``bleedwatch demo``. ``engine.py`` is a paged-KV engine with the incident's bug (``mode="buggy"``) or the
fix (``mode="fixed"``); ``front.py`` serves it as an OpenAI-compatible API; ``gateway.py`` is the
gateway that authenticates tenants and reports through ``bleedwatch tap`` (service/tap/);
``reporter.py`` is how the engine reports its serving config and integrity signals;
``traffic.py`` and ``corpus.py`` make tenants' traffic from standard-library docstrings;
``cli.py`` is ``bleedwatch sim``. docs/simulator.md describes it all.
"""
