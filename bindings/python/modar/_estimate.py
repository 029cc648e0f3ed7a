"""modar.estimate: FLOPs, parameters, memory and step time of one
configuration (cost_models/), as `modar estimate CONFIG --json`."""

from __future__ import annotations

from typing import Any

from . import _core
from ._config import Config, as_config
from ._results import Result, _fmt


def time_by_kind(document: dict) -> dict[str, float]:
    """{op kind: predicted seconds per step} from an estimate document."""
    return {row["kind"]: float(row["time_s"]) for row in document["time"]["by_kind"]}


class EstimateResult(Result):
    """One configuration's counts and predicted time (`modar estimate --json`)."""

    @property
    def step_s(self) -> float:
        return self._doc["time"]["step_s"]

    def to_pandas(self):
        """The step time by op kind: count, FLOPs, bytes, seconds, share."""
        import pandas as pd

        return pd.DataFrame(self._doc["time"]["by_kind"])

    def __repr__(self) -> str:
        d = self._doc
        model = d.get("config", {}).get("model", {})
        params, flops, memory, time = d["params"], d["flops"], d["memory"], d["time"]
        lines = [
            f"<modar.EstimateResult: {d.get('step', 'train')} step, "
            f"L={model.get('n_layers', '?')} d={model.get('d_model', '?')} on "
            f"{d.get('conventions', {}).get('profile', '?')}>",
            f"  params       total {_fmt(params['total'])}, FLOP-active {_fmt(params['flop_active'])}",
            f"  FLOPs/token  forward {_fmt(flops['forward_per_token'])}, train {_fmt(flops['train_per_token'])}",
            f"  memory       peak {memory['peak_bytes'] / 2**30:.2f} GiB "
            f"({'fits' if memory['fits'] else 'does NOT fit'})",
            f"  time         step {_fmt(time['step_s'])} s, {_fmt(time['tokens_per_s'])} tokens/s, "
            f"MFU {time['mfu']:.1%}",
        ]
        return "\n".join(lines)


def estimate(config: Any = None, *, profile: Any = None, step: str = "train", **overrides: Any) -> EstimateResult:
    """Estimate one configuration: a Config, dict or TOML path, plus keyword
    overrides.  profile: a name, a TOML path or a modar.Profile (default: the
    configuration's device.profile).  step: "train" or "decode"."""
    from ._planner import _profile_ref
    from ._profile import Profile, load_profile

    cfg = as_config(config) if config is not None else Config()
    if profile is not None:  # like the CLI's --profile: it becomes device.profile
        overrides = {**overrides, "device": {"profile": _profile_ref(profile)}}
    if overrides:
        cfg = cfg.replace(**overrides)
    prof = profile if isinstance(profile, Profile) else load_profile(cfg["device.profile"])
    return EstimateResult(_core.estimate(cfg._cpp, prof._cpp, step))
