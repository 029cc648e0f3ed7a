"""modar: a compute-budget planner for transformers with Mixture-of-Depths (MoD)
and Dual Attention Residuals (DAR).

The numbers come from the C++ core (modar._core); every result's .to_dict()
is the document the `modar` CLI prints with --json for the same inputs.

    >>> import modar
    >>> plan = modar.optimal(flops=1e20)
    >>> plan.to_pandas()[["arch", "shape.n_layers", "shape.d_model", "loss"]]
"""

from __future__ import annotations

from . import _core
from ._calibrate import CalibrationResult, calibrate, calibration_parameters
from ._config import Config, MegatronArgsWarning
from ._hf import HfImportWarning
from ._estimate import EstimateResult, estimate, estimate_batch
from ._layout import LayoutResult, layout
from ._core import BackendError, ConfigError, FileError, ShapeError
from ._planner import (
    FitResult,
    OptimalResult,
    SweepResult,
    closed_form_optimum,
    fit,
    optimal,
    sweep,
)
from ._profile import Profile, load_profile, profile_names
from ._runtime import ValidationResult, profile, validate
from ._cli import cli_path

__version__ = _core.__version__

__all__ = [
    "BackendError",
    "CalibrationResult",
    "Config",
    "EstimateResult",
    "ConfigError",
    "FileError",
    "FitResult",
    "HfImportWarning",
    "LayoutResult",
    "MegatronArgsWarning",
    "OptimalResult",
    "Profile",
    "ShapeError",
    "SweepResult",
    "ValidationResult",
    "calibrate",
    "calibration_parameters",
    "cli_path",
    "closed_form_optimum",
    "estimate",
    "estimate_batch",
    "fit",
    "layout",
    "load_profile",
    "optimal",
    "profile",
    "profile_names",
    "sweep",
    "validate",
]
