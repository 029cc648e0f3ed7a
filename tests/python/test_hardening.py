"""Hostile input from Python: every case is a one-line ValueError / TypeError
naming the argument or field, never a crash, a silently spliced TOML key, a
multi-line pybind11 message, an AttributeError or a UnicodeDecodeError."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

import modar
from modar import _core
from modar._args import one_line_type_errors

REPO = Path(__file__).resolve().parents[2]


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


def one_line_error(error: type, call) -> str:
    """The message of the `error` that call() raises, checked to be one line."""
    with pytest.raises(error) as info:
        call()
    return one_line(info.value)


# ---- configurations are built through the C++ API, never TOML text -------------

def test_a_key_cannot_splice_a_second_assignment():
    with pytest.raises(ValueError) as info:
        modar.Config(model={"d_model = 128\nn_layers": 3})
    assert "d_model = 128\\nn_layers" in one_line(info.value)  # the key, named (escaped)
    with pytest.raises(ValueError, match="unknown configuration key"):
        modar.Config({"model.d_model = 128\n[mod]\nevery": 2})


def test_a_string_value_is_one_value():
    # a choice must be one of its names, whole
    with pytest.raises(ValueError) as info:
        modar.Config(mlp='gelu"\nd_model = 128\n#')
    assert "model.mlp" in str(info.value)
    # a text value with a line break (TOML injection) is refused, naming the field
    with pytest.raises(ValueError) as info:
        modar.Config(device={"profile": 'x.toml"\n[model]\nd_model = 64\n#'})
    assert "device.profile" in one_line(info.value) and "control characters" in str(info.value)
    # quotes and TOML syntax on one line are a text value: kept verbatim, nothing else changes
    hostile = 'x.toml" [model] d_model = 64 #'
    config = modar.Config(device={"profile": hostile})
    assert config["device.profile"] == hostile
    assert config["model.d_model"] == 2048  # the default, untouched
    again = modar.Config.from_toml_string(config.to_toml())  # the core's writer escapes it
    assert again == config and again["device.profile"] == hostile


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"d_model": "1024"}, "model.d_model"),      # a str never becomes a number
        ({"d_model": 1024.0}, "model.d_model"),      # an integer key refuses a float (as TOML)
        ({"d_model": True}, "model.d_model"),
        ({"tie_embeddings": 1}, "model.tie_embeddings"),
        ({"tie_embeddings": "true"}, "model.tie_embeddings"),
        ({"capacity": "0.5"}, "mod.capacity"),
        ({"capacity": float("inf")}, "mod.capacity"),
        ({"d_model": 2**70}, "model.d_model"),
        ({"d_model": [1024]}, "model.d_model"),
        ({"d_model": None}, "model.d_model"),
        ({"device": {"profile": 7}}, "device.profile"),
        ({"model": {"d_model": {"x": 1}}}, "model.d_model"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_field(kwargs, field):
    assert field in one_line_error(ValueError, lambda: modar.Config(**kwargs))


def test_typed_values_that_are_allowed():
    import numpy as np

    config = modar.Config(d_model=np.int32(512), n_heads=np.int64(8), capacity=1, every=np.uint8(2),
                          tie_embeddings=np.bool_(True), norm_eps=np.float32(0.5))
    assert config["model.d_model"] == 512 and config["mod.capacity"] == 1.0
    assert config["model.tie_embeddings"] is True and config["model.norm_eps"] == 0.5
    # the sections of the C++ struct, bound with the same typed keys
    cpp = config._cpp
    assert cpp.model.d_model == 512 and cpp.mod.every == 2 and cpp.dar.variant == "none"
    cpp.model.mlp = "swiglu"
    assert config["model.mlp"] == "swiglu"
    with pytest.raises(ValueError, match="model.mlp"):
        cpp.model.mlp = "relu"
    with pytest.raises(ValueError, match="model.n_layers"):
        cpp.model.n_layers = 2.5


_OVERFLOW = """
import modar
try:
    modar.Config(train={"micro_batch": 2**32, "global_batch": 2**33}, device={"count": 2**32})
except ValueError as error:
    print("ValueError:", error)
"""


def test_micro_batch_times_count_overflow_is_a_value_error_not_a_crash():
    # 2^32 * 2^32 wraps to 0 in 64 bits; the modulo by it killed the process (SIGFPE)
    proc = subprocess.run([sys.executable, "-c", _OVERFLOW], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ValueError: train.micro_batch = 4294967296: must be <=")


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: modar.Config(device={"count": 2**40}, global_batch=8), "device.count"),
        (lambda: modar.optimal(flops=1e20, gpus=2**40, global_batch=8), "gpus"),
        (lambda: modar.optimal(flops=1e20, gpus=2**70), "gpus"),
        (lambda: modar.optimal(flops=1e20, every=2**70), "every"),
        (lambda: modar.estimate_batch({"train.micro_batch": [2**32], "device.count": [2**32],
                                       "train.global_batch": [8]}), "train.micro_batch"),
    ],
)
def test_huge_integers_are_value_errors(call, field):
    assert field in one_line_error(ValueError, call)


# ---- priors: a dict is names and numbers, not text ------------------------------

def test_eps_keys_cannot_inject_a_second_prior():
    with pytest.raises(ValueError) as info:
        modar.optimal(flops=1e20, arch=["baseline", "mod"], eps={"mod=0.5,dar": 0.9})
    assert "mod=0.5,dar" in one_line(info.value)


def test_eps_dict_sets_the_prior():
    plan = modar.optimal(flops=1e20, arch=["mod"], eps={"mod": 0.9})
    assert plan.best("mod")["eps"] == 0.9


@pytest.mark.parametrize(
    "eps, error, text",
    [
        ([("mod", 0.9)], TypeError, "eps"),
        (0.9, TypeError, "eps"),
        ({"mod": "0.9"}, TypeError, "eps['mod']"),
        ({"mod": -1.0}, ValueError, "mod"),
        ({"mod": float("nan")}, ValueError, "mod"),
        ({"mod": 1e-300}, ValueError, "eps[mod] = 1e-300"),
        ({"mixtral": 0.9}, ValueError, "mixtral"),
        ({1: 0.9}, TypeError, "eps key"),
        ({" mod": 0.9}, ValueError, "eps[ mod]"),
    ],
)
def test_bad_eps(eps, error, text):
    with pytest.raises(error) as info:
        modar.optimal(flops=1e20, arch=["mod"], eps=eps)
    assert text in one_line(info.value)
    assert not isinstance(info.value, AttributeError)


# ---- closed form -------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"flops": 0.0}, "flops"),
        ({"flops": -1e20}, "flops"),
        ({"flops": math.nan}, "flops"),
        ({"flops": math.inf}, "flops"),
        ({"flops": 1e20, "eps": 0.0}, "eps"),
        ({"flops": 1e20, "eps": -0.5}, "eps"),
        ({"flops": 1e20, "eps": math.nan}, "eps"),
        ({"flops": 1e20, "eps": math.inf}, "eps"),
        ({"flops": 1e20, "eps": 1e-300}, "eps"),  # issue 24: returned tokens_opt = inf
        ({"flops": 1e20, "eps": 1.6}, "eps"),
        ({"flops": 1e36}, "flops"),
        ({"flops": 5e-324}, "flops"),
    ],
)
def test_closed_form_refuses_nonsense(kwargs, field):
    flops = kwargs.pop("flops")
    message = one_line_error(ValueError, lambda: modar.closed_form_optimum(flops, **kwargs))
    assert message.startswith(field)


def test_closed_form_flops_must_be_a_number():
    assert "flops" in one_line_error(TypeError, lambda: modar.closed_form_optimum("1e20"))


# ---- strings that are not text (a lone surrogate) ------------------------------------

@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: modar.Config(profile="\ud800"), "profile"),                 # issue 24
        (lambda: modar.Config("\ud800.toml"), "source"),
        (lambda: modar.Config(model={"mlp": "\udfff"}), "model"),
        (lambda: modar.optimal(flops=1e20, arch=["baseline", "\ud800"]), "arch"),
        (lambda: modar.optimal(flops=1e20, profile="h\ud800"), "profile"),
        (lambda: modar.optimal(flops=1e20, eps={"\ud800": 0.9}), "eps"),
        (lambda: modar.sweep(1e20, fit="\ud800"), "fit"),
        (lambda: modar.estimate(modar.Config(), step="\ud800"), "step"),
        (lambda: modar.load_profile("\ud800"), "name_or_path"),
        (lambda: modar.fit("\ud800.csv"), "runs"),
        (lambda: modar.closed_form_optimum(1e20, fit="\ud800"), "fit"),
        (lambda: modar.profile("\ud800.toml", quick=True, dry_run=True), "out"),
        (lambda: modar.validate("\ud800.toml"), "profile"),
        (lambda: modar.calibrate("runs.csv", profile="a\ud800"), "profile"),
    ],
)
def test_a_lone_surrogate_is_a_value_error_naming_the_argument(call, name):
    text = one_line_error(ValueError, call)
    assert f"{name} = " in text and "not valid text" in text
    assert "Unable to cast" not in text


# ---- numbers in type but meaningless, at the library boundary ------------------------

def test_profile_max_dim_zero_is_refused(tmp_path):
    # issue 24: max_dim=0 used to mean "no bound" and was accepted
    with pytest.raises(ValueError) as info:
        modar.profile(tmp_path / "p.toml", quick=True, kinds=["rmsnorm"], max_dim=0, dry_run=True)
    assert one_line(info.value).startswith("max_dim = 0")
    assert not (tmp_path / "p.toml").exists()


# ---- type errors are one line naming the argument ----------------------------------

@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: modar.estimate(modar.Config(), step=3), "step"),
        (lambda: modar.Config(3.5), "config"),
        (lambda: modar.optimal(flops=1e20, aspect=4.0), "aspect"),
        (lambda: modar.Config.from_hf(12), "config"),
    ],
)
def test_type_errors_name_the_argument(call, name):
    assert name in one_line_error(TypeError, call)


def test_pybind_argument_errors_become_one_line():
    with pytest.raises(TypeError) as raw:
        _core.estimate(3)
    assert "incompatible function arguments" in str(raw.value) and "\n" in str(raw.value)
    @one_line_type_errors
    def estimate():
        return _core.estimate(3)

    with pytest.raises(TypeError) as info:
        estimate()
    text = one_line(info.value)
    assert text.startswith("modar.estimate: an argument has the wrong type for estimate(")
    assert "config: Config" in text and "step: str" in text


def test_fit_seed_beyond_64_bits_is_a_value_error():
    # (a Python int the request's 64-bit field cannot hold: ValueError naming it)
    import pandas as pd

    runs = pd.DataFrame({"N": [1e8] * 5, "D": [1e9] * 5, "loss": [3.0] * 5})
    with pytest.raises(ValueError) as info:
        modar.fit(runs, seed=2**70)
    assert "seed" in one_line(info.value)


# ---- files that are not UTF-8 ---------------------------------------------------------

def test_hf_config_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"hidden_size": 512, "name": "caf\xe9"}')
    with pytest.raises(ValueError) as info:
        modar.Config.from_hf(path)
    assert "config.json" in one_line(info.value) and "UTF-8" in str(info.value)
    assert not isinstance(info.value, UnicodeDecodeError)


def test_toml_config_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[device]\nprofile = "caf\xe9"\n')
    with pytest.raises(ValueError) as info:
        modar.Config(path)
    assert "latin1.toml" in one_line(info.value)
    assert not isinstance(info.value, UnicodeDecodeError)


def test_runs_csv_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_bytes(b"N,D,lo\xe9ss\n1e8,1e9,3.0\n")  # Latin-1 header, echoed by the core
    with pytest.raises(ValueError) as info:
        modar.fit(path, bootstrap_samples=0)
    assert "runs.csv" in one_line(info.value) and "\\xe9" in str(info.value)
    assert not isinstance(info.value, UnicodeDecodeError)
