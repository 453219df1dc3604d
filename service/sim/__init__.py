"""A toy multi-tenant inference stack that reproduces the incident, for tests and the demo.

Not part of the service: nothing in ``service/`` outside ``service/sim`` and ``service/demo``
imports it. ``engine.py`` is a paged-KV engine with the incident's bug (``mode="buggy"``) or the
fix (``mode="fixed"``); ``front.py`` serves it as an OpenAI-compatible API; ``gateway.py`` is the
gateway shim that fingerprints every exchange with the SDK and ships it to bleedwatch;
``reporter.py`` is how the engine reports its serving config and integrity signals.
"""
