"""The model and what runs it: the model handle that carries the network, its info and
its tokenizer (:mod:`~depthkit.engine.handle`); loading (:mod:`~depthkit.engine.models`,
with the names it knows in :mod:`~depthkit.engine.catalog`, tiny random models in
:mod:`~depthkit.engine.tiny`, converted embedded copies and GGUF files in
:mod:`~depthkit.engine.converted`, weight hashes in :mod:`~depthkit.engine.fingerprint`);
number formats (:mod:`~depthkit.engine.precision`); batches of prompts
(:mod:`~depthkit.engine.batching`); the layer that says what a pass reads and writes
(:mod:`~depthkit.engine.capture`, its patched runs in :mod:`~depthkit.engine.patched`);
attention, shared prefixes and kept contexts (:mod:`~depthkit.engine.attention`,
:mod:`~depthkit.engine.prefix`, :mod:`~depthkit.engine.contexts`)."""
