"""The ground floor, imported by every other package: where depthkit keeps files and
how it writes them (:mod:`~depthkit.core.files`), chapter parameters
(:mod:`~depthkit.core.params`), what a result says about its model
(:mod:`~depthkit.core.model_info`) and saved chapter runs
(:mod:`~depthkit.core.results`). Nothing here imports torch."""
