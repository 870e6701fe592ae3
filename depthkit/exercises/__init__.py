"""Exercises for instructors: a student notebook per chapter (``notebooks/exercises/``)
in which the learner writes the chapter's key function, and the checks that say
whether it is right.

>>> import depthkit.exercises as ex
>>> from depthkit.exercises.solutions import readout as my_readout  # a student writes their own
>>> ex.check_readout(my_readout)        # chapter 00: final norm, then unembedding
✔ readout is right: ...

Every check runs the student's function on tiny practice models or small synthetic
data, compares it with depthkit's own implementation and with an independent
computation, and raises :class:`ExerciseError` with a plain-words diagnosis (wrong
shape, forgot the final norm, off by one layer, counted layer 0, wrong sign, ...)
when it is wrong. Reference solutions: :mod:`depthkit.exercises.solutions`. The
book shows each notebook as a page with the solutions folded away
(:mod:`depthkit.exercises.pages`).
"""

from depthkit.exercises._check import ExerciseError
from depthkit.exercises._fixtures import practice_model
from depthkit.exercises.frequency_checks import check_flip_rate, check_frequency_bucket, example_steps
from depthkit.exercises.lens_checks import check_logit_lens, check_readout
from depthkit.exercises.onset_checks import check_onset_layer
from depthkit.exercises.patch_checks import check_patched_logit_diff

# Which check tests which exercise function (the name the stub defines).
CHECKS = {
    "readout": check_readout,
    "logit_lens": check_logit_lens,
    "frequency_bucket": check_frequency_bucket,
    "flip_rate": check_flip_rate,
    "patched_logit_diff": check_patched_logit_diff,
    "onset_layer": check_onset_layer,
}

__all__ = [
    "CHECKS",
    "ExerciseError",
    "check_flip_rate",
    "check_frequency_bucket",
    "check_logit_lens",
    "check_onset_layer",
    "check_patched_logit_diff",
    "check_readout",
    "example_steps",
    "practice_model",
]
