"""TunePlane: the control plane (`tuneplane.app`), its workers (`tuneplane.workers`) and the SDK for
workloads (`from tuneplane import sdk`).

The repository keeps `app/` and `workers/` at its top; the wheel installs them as
`tuneplane/app` and `tuneplane/workers` (pyproject.toml). In a source checkout the two folders sit next to
this package, so its search path also covers the checkout's top: `tuneplane.app` is then `<checkout>/app`.
Nothing named `app` or `workers` is ever installed at the top of site-packages, where it would collide
with a workload's own modules.
"""

from pathlib import Path as _Path

_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "app" / "__init__.py").is_file():
    __path__.append(str(_checkout))
del _Path, _checkout
