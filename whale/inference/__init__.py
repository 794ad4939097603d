"""Inference clients behind one interface (``whale.inference.base.InferenceClient``).

Modules: ``base`` (the interface), ``openai_http`` (HTTP client, vLLM), ``transport`` (its lean
HTTP/1.1 connection pool), ``transformers_backend`` (in-process), ``server`` (OpenAI-compatible
server over any client), ``scripted`` (given replies; fixed-latency stand-in), ``factory``.

Heavy backends (torch, transformers, FastAPI) are imported only from their own modules.
:func:`whale.inference.factory.make_client` picks a backend from the spec.
"""
