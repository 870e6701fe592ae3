"""The model and what runs it: the model handle that carries the network, its info and
its tokenizer (:mod:`~depthkit.engine.handle`); loading (:mod:`~depthkit.engine.models`,
with the names it knows in :mod:`~depthkit.engine.catalog`, tiny random models in
:mod:`~depthkit.engine.tiny`, converted embedded copies and GGUF files in
:mod:`~depthkit.engine.converted`, weight hashes in :mod:`~depthkit.engine.fingerprint`);
number formats (:mod:`~depthkit.engine.precision`); batches of prompts
(:mod:`~depthkit.engine.batching`); the one module that runs hooks
(:mod:`~depthkit.engine.capture`); attention and shared prefixes
(:mod:`~depthkit.engine.attention`, :mod:`~depthkit.engine.prefix`)."""
