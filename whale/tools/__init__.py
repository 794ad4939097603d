"""Tool services the domains call: a passage retriever (search QA) and a Python code interpreter (math).

Each is usable in-process (``whale.tools.retrieval_index``, ``whale.tools.code``) and as a small HTTP service
that a cluster deploys once and every harness process calls (``python -m whale.tools.retriever_service``,
``python -m whale.tools.code_interpreter``); ``whale.tools.client`` speaks to both services.
``whale.tools.prepare_index`` builds or adopts a dense retrieval index (the paper's e5 over wiki-18
included), and ``whale.tools.fetch`` is the init container that copies a service's files from the store.
"""
