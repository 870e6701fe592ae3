"""depthkit: layer-by-layer lenses on language models, for the book
*How LLMs Use Their Depth*.

>>> import depthkit as dk
>>> model = dk.load_model("smollm2-135m")
>>> traj = dk.trajectories(model, ["The capital of France is"])
>>> traj.top1_table()
"""

from depthkit import data, frequency
from depthkit.capture import Item
from depthkit.chapters import check_chapter_params, model_options
from depthkit.explorer import explore
from depthkit.lens_store import resolve_lens
from depthkit.lenses import DEFAULT_LENS, Lens, LogitLens, layer_plan
from depthkit.models import DEFAULT_MODEL, ModelInfo, ModelLoadError, available_models, load_model, model_info
from depthkit.params import Param, ParameterError, check_params
from depthkit.results import RunRecorder, list_runs, load_run
from depthkit.trajectories import Trajectories, answer_token_ids, encode, make_items, trajectories
from depthkit.tuned_lens import lens_for

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
