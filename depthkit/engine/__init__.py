"""The model and what runs it: loading (:mod:`~depthkit.engine.models`), the model
handle that carries the model, its info and its tokenizer
(:mod:`~depthkit.engine.handle`), number formats (:mod:`~depthkit.engine.precision`),
the one module that runs hooks (:mod:`~depthkit.engine.capture`), attention masks and
shared prefixes (:mod:`~depthkit.engine.attention`, :mod:`~depthkit.engine.prefix`)."""
