"""Chapter parameter checks: types, ranges, choices, typos, and the messages."""

from __future__ import annotations

import numpy as np
import pytest

from depthkit.core.params import Param, ParameterError, check_params


def test_valid_values_are_converted_and_ordered_by_spec():
    out = check_params(
        {"lens": "logit", "n": np.int64(5), "frac": 1, "flag": np.bool_(True), "names": ("a", "b"), "root": None},
        n=Param(int, min=1),
        frac=Param(float, min=0, max=1),
        lens=Param(str, choices=("tuned", "logit")),
        flag=Param(bool),
        names=Param(list, item=str),
        root=Param(str, optional=True),
    )
    assert out == {"n": 5, "frac": 1.0, "lens": "logit", "flag": True, "names": ["a", "b"], "root": None}
    assert list(out) == ["n", "frac", "lens", "flag", "names", "root"]
    assert type(out["n"]) is int and type(out["frac"]) is float and type(out["flag"]) is bool


def test_the_brief_example_message():
    with pytest.raises(ParameterError) as e:
        check_params({"n_prompts": -3}, chapter="01", n_prompts=Param(int, min=1, example=200))
    assert str(e.value) == (
        "n_prompts must be an integer >= 1, got -3 (int). "
        "Re-run with a valid value, e.g. `depthkit run 01 -p n_prompts=200`."
    )


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (True, "True/False is not a number"),
        (200.0, "write 200, not 200.0"),
        ("200", "write 200 without quotes"),
        (2.5, "got 2.5 (float)"),
        (None, "it is required"),
    ],
)
def test_int_refuses_bools_floats_and_strings(value, fragment):
    with pytest.raises(ParameterError) as e:
        check_params({"n": value}, n=Param(int, min=1))
    assert fragment in str(e.value)
    assert str(e.value).startswith("n must be an integer >= 1, got")


def test_integral_float_suggests_the_integer_in_the_command():
    with pytest.raises(ParameterError, match=r"`depthkit run 02 -p n=200`"):
        check_params({"n": 200.0}, chapter="02_mcq", n=Param(int, min=1))


def test_float_accepts_ints_refuses_bool_nan_and_range():
    assert check_params({"x": 3}, x=Param(float)) == {"x": 3.0}
    with pytest.raises(ParameterError, match="True/False"):
        check_params({"x": False}, x=Param(float))
    with pytest.raises(ParameterError, match="finite"):
        check_params({"x": float("nan")}, x=Param(float))
    with pytest.raises(ParameterError, match=r"between 0 and 1, got 1.5 \(float\).*-p x=1.0"):
        check_params({"x": 1.5}, x=Param(float, min=0, max=1))


def test_bounds_are_inclusive():
    spec = {"k": Param(int, min=1, max=10)}
    assert check_params({"k": 1}, **spec) == {"k": 1}
    assert check_params({"k": 10}, **spec) == {"k": 10}
    with pytest.raises(ParameterError, match=r"between 1 and 10, got 11 \(int\).*-p k=10"):
        check_params({"k": 11}, **spec)


def test_choices_suggest_a_close_match():
    with pytest.raises(ParameterError) as e:
        check_params({"lens": "tunde"}, lens=Param(str, choices=("tuned", "logit")))
    msg = str(e.value)
    assert "one of 'tuned', 'logit'" in msg and "got 'tunde' (str)" in msg and "did you mean 'tuned'?" in msg
    assert "-p lens=tuned" in msg


def test_bool_refuses_strings_and_ints():
    with pytest.raises(ParameterError, match="write True without quotes"):
        check_params({"f": "true"}, f=Param(bool))
    with pytest.raises(ParameterError, match=r"must be True or False, got 1 \(int\)"):
        check_params({"f": 1}, f=Param(bool))


def test_str_refuses_numbers():
    with pytest.raises(ParameterError, match=r"must be a string, got 3 \(int\)"):
        check_params({"model": 3}, model=Param(str))


def test_list_items_choices_and_length():
    spec = {"names": Param(list, item=str, choices=("a", "b", "c"), min=1, max=2)}
    assert check_params({"names": "a, b"}, **spec) == {"names": ["a", "b"]}
    with pytest.raises(ParameterError, match=r"element 1 is 3 \(int\)"):
        check_params({"names": ["a", 3]}, **spec)
    with pytest.raises(ParameterError, match="element 0 'd' is not allowed"):
        check_params({"names": ["d"]}, **spec)
    with pytest.raises(ParameterError, match="it has 3 items"):
        check_params({"names": ["a", "b", "c"]}, **spec)
    with pytest.raises(ParameterError, match="it has 0 items"):
        check_params({"names": []}, **spec)
    with pytest.raises(ParameterError, match="a list of strings"):
        check_params({"names": 5}, **spec)
    assert check_params({"ks": [1, np.int32(10)]}, ks=Param(list, item=int)) == {"ks": [1, 10]}
    with pytest.raises(ParameterError, match="element 0 is True"):
        check_params({"ks": [True]}, ks=Param(list, item=int))


def test_unknown_key_is_a_typo_error():
    with pytest.raises(ParameterError) as e:
        check_params({"n_prompts": 3, "n_promts": 4}, n_prompts=Param(int))
    assert "Unknown parameter 'n_promts'" in str(e.value) and "Did you mean 'n_prompts'?" in str(e.value)


def test_missing_required_and_optional():
    with pytest.raises(ParameterError, match="Parameter 'seed' is missing"):
        check_params({}, seed=Param(int))
    assert check_params({}, root=Param(str, optional=True)) == {"root": None}


def test_help_is_shown_and_command_without_chapter():
    with pytest.raises(ParameterError) as e:
        check_params({"frac": -1.0}, frac=Param(float, min=0, help="share of prompts"))
    assert str(e.value).startswith("frac (share of prompts) must be a number >= 0")
    assert "`depthkit run <chapter> -p frac=0.0` (or papermill's `-p` option)" in str(e.value)


def test_a_parameter_called_chapter_can_be_declared():
    assert check_params({"chapter": "x"}, chapter=Param(str)) == {"chapter": "x"}


def test_bad_specs_are_programming_errors():
    with pytest.raises(TypeError):
        Param(dict)
    with pytest.raises(TypeError):
        Param(int, item=str)
    with pytest.raises(ValueError):
        Param(int, min=3, max=1)
    with pytest.raises(TypeError):
        check_params({"n": 1}, n=int)
