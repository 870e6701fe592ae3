"""One file per kind of lens, each defining ``KIND``, a
:class:`~depthkit.lens.registry.LensKind`; :mod:`depthkit.lens.registry` lists
this folder to find them."""
