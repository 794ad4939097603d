"""Inference clients behind one interface (``whale.inference.base.InferenceClient``).

Heavy backends (torch, transformers, FastAPI) are imported only from their own modules.
:func:`whale.inference.factory.make_client` picks a backend from the spec.
"""
