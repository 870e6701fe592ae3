"""depthkit: layer-by-layer lenses on language models, for the book
*How LLMs Use Their Depth*.

>>> import depthkit as dk
>>> model = dk.load_model("tiny-llama", seed=0)  # the book's default is "smollm2-135m"
>>> traj = dk.trajectories(model, ["The capital of France is"], progress=False)
>>> table = traj.top1_table()  # the last position's top-1 token at every depth
>>> len(table) == model.info.n_blocks + 1, list(table.columns)
(True, ['layer', 'top1_token', 'top1_prob', 'entropy', 'kl_to_final'])

The packages, read bottom to top (each imports only those below it; the layering
test names the few exceptions):

- :mod:`depthkit.core`: where files go and how they are written, parameters,
  model descriptions, saved chapter runs;
- :mod:`depthkit.stats`: the one bootstrap and interval convention, and the
  wording of findings;
- :mod:`depthkit.data`: the embedded sets, the corpus split, users' files;
- :mod:`depthkit.engine`: loading a model and running it (the one module that runs
  hooks);
- :mod:`depthkit.lens`: lens kinds, training, storage, and trajectories read through
  a lens;
- :mod:`depthkit.analyses`: one module per analysis of the book;
- :mod:`depthkit.plots`: charts and the interactive explorer;
- :mod:`depthkit.chapters` and :mod:`depthkit.exercises`: what each notebook calls;
- :mod:`depthkit.verdicts`: the pre-registered verdict rules;
- :mod:`depthkit.book`: executing chapters, pages, the site, reference runs;
- :mod:`depthkit.cli`: the ``depthkit`` command.
"""

from depthkit import _moved, data
from depthkit.analyses import frequency
from depthkit.chapters import check_chapter_params, model_options
from depthkit.core.params import Param, ParameterError, check_params
from depthkit.core.results import RunRecorder, list_runs, load_run
from depthkit.engine.capture import Item
from depthkit.engine.models import DEFAULT_MODEL, ModelInfo, ModelLoadError, available_models, load_model, model_info
from depthkit.lens import get_lens, lens_for, resolve_lens
from depthkit.lens.base import DEFAULT_LENS, Lens, LogitLens, layer_plan
from depthkit.lens.trajectories import Trajectories, answer_token_ids, encode, make_items, trajectories
from depthkit.plots.explorer import explore

__all__ = [
    "DEFAULT_LENS",
    "DEFAULT_MODEL",
    "Item",
    "Lens",
    "Param",
    "ParameterError",
    "RunRecorder",
    "check_chapter_params",
    "check_params",
    "data",
    "frequency",
    "get_lens",
    "list_runs",
    "load_run",
    "LogitLens",
    "ModelInfo",
    "ModelLoadError",
    "Trajectories",
    "answer_token_ids",
    "available_models",
    "encode",
    "explore",
    "layer_plan",
    "lens_for",
    "load_model",
    "make_items",
    "model_info",
    "model_options",
    "resolve_lens",
    "trajectories",
]

_moved.install()


def __getattr__(name: str):
    # ``dk.metrics`` and other module names from before the packages: the moved module.
    if name in _moved.MOVED:
        module = globals()[name] = _moved.moved(name)  # warn once per name
        return module
    raise AttributeError(f"module 'depthkit' has no attribute {name!r}")
