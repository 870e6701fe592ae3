"""What every checker shares: the error a wrong answer raises, calling the
student's function so that its own exceptions come back as plain advice, and
comparing tensors with a tolerance that float32 round-off never trips."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

# Checks compare against depthkit computed on the same float32 model: the only
# differences of a right answer are summation order, far below this.
ATOL = 1e-4
RTOL = 1e-4

Hint = Callable[[BaseException], "str | None"]
F = TypeVar("F", bound=Callable[..., Any])


class ExerciseError(AssertionError):
    """The student's function gives a wrong answer. The message says what is wrong
    in words (and, where the mistake is a common one, which one it is); it is an
    AssertionError so that test runners and graders treat it as a failed check."""


def call(fn: Callable[..., Any], name: str, *args: Any, hint: Hint | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with the student's exceptions turned into an
    :class:`ExerciseError` that says what happened (``hint`` may add why)."""
    __tracebackhide__ = True  # IPython and pytest hide this frame: the message is the point
    if not callable(fn):
        raise ExerciseError(f"Pass the function itself to the check, e.g. check(`{name}`), not {type(fn).__name__}.")
    try:
        with torch.no_grad():  # the checks never need gradients, and they are slower with them
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise ExerciseError(
            f"`{name}` is not written yet: replace the `raise NotImplementedError` line in its cell with your "
            "code, run that cell, then run this check again."
        ) from None
    except ExerciseError:
        raise
    except Exception as err:  # noqa: BLE001 - any error of the student's code becomes advice
        extra = hint(err) if hint else None
        raise ExerciseError(
            f"`{name}` raised {type(err).__name__}: {err}" + (f"\nHint: {extra}" if extra else "")
        ) from None


def as_tensor(value: Any, name: str, what: str = "logits") -> Tensor:
    """The student's return value as a float tensor, or a plain explanation of why
    it is not one."""
    __tracebackhide__ = True
    if value is None:
        raise ExerciseError(f"`{name}` returned None: did you forget the `return` line?")
    if isinstance(value, tuple):
        raise ExerciseError(f"`{name}` returned a tuple of {len(value)}; return only the {what} tensor.")
    if not isinstance(value, Tensor):
        raise ExerciseError(f"`{name}` returned a {type(value).__name__}; return the {what} as a torch tensor.")
    return value.detach().float().cpu()


def close(a: Tensor, b: Tensor) -> bool:
    """Same shape and equal up to float32 round-off."""
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), atol=ATOL * max(1.0, float(b.abs().max())), rtol=RTOL))


def shape_of(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def passed(message: str) -> None:
    """The one line a right answer gets."""
    print(f"✔ {message}")


def single_threaded(check: F) -> F:
    """Run ``check`` with one torch thread. The practice models are so small that
    splitting their matrix products across threads costs more than it saves: on a
    busy two-core machine a tiny forward pass is ten times faster on one thread."""

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return check(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return run  # type: ignore[return-value]
