"""IPython formatters the python kernels load at start (an IPython startup file, installed by
the server into the profile its kernels use): what E2B's SDKs read from a result besides
IPython's own MIME types.

- `e2b/data`: a pandas DataFrame as `{column: [values]}` (timestamps as ISO strings); any
  object with `_repr_e2b_data_`.
- `e2b/chart`: a matplotlib Figure as `e2b_charts` describes it (`{}` if it cannot);
  any object with `_repr_e2b_chart_`.
- `application/json`: lists and dicts as JSON (numpy values as numbers), so a dict as the
  last expression is a result's `json`.
- PIL images: `show()` and `save("x.png")` display the image (a PNG result) in the kernel,
  where no viewer exists.

pandas, matplotlib and PIL are only looked at when the code imported them: the kernel's
start stays light. This module runs inside the kernel; it imports nothing of aenv."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """JSON's own types for numpy's scalars and arrays, and for timestamps."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _data(obj: Any) -> Any:
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(obj, pd.DataFrame):
        cols = obj.to_dict(orient="list")
        return {str(k): [v.isoformat() if isinstance(v, pd.Timestamp) else v for v in col]
                for k, col in cols.items()}  # fmt: skip
    return None


def _chart(obj: Any) -> Any:
    mpl = sys.modules.get("matplotlib.figure")
    if mpl is not None and isinstance(obj, mpl.Figure):
        try:
            from e2b_charts import chart_figure_to_dict

            return chart_figure_to_dict(obj)
        except Exception:  # a figure e2b_charts cannot read is still shown as its PNG
            return {}
    return None


def install(ip: Any) -> None:
    """Register the formatters on IPython shell `ip`."""
    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from traitlets import ObjectName, Unicode

    def e2b(mime: str, method: str, find: Any) -> Any:
        """A formatter of `mime`: what `find` makes of an object, else its `method`."""

        class Formatter(BaseFormatter):  # type: ignore[misc]
            format_type = Unicode(mime)
            print_method = ObjectName(method)
            _return_type = (dict, str)

            def __call__(self, obj: Any) -> Any:
                found = find(obj)
                return found if found is not None else super().__call__(obj)

        return Formatter(parent=ip.display_formatter)

    class ListsAsJson(JSONFormatter):  # type: ignore[misc]
        def __call__(self, obj: Any) -> Any:
            if isinstance(obj, list | dict):
                try:
                    return json.loads(json.dumps(obj, default=_plain)), {"expanded": True}
                except (TypeError, ValueError):
                    pass
            return super().__call__(obj)

    formatters = ip.display_formatter.formatters
    formatters["e2b/data"] = e2b("e2b/data", "_repr_e2b_data_", _data)
    formatters["e2b/chart"] = e2b("e2b/chart", "_repr_e2b_chart_", _chart)
    formatters["application/json"] = ListsAsJson(parent=ip.display_formatter)
    _pil_shows_itself()


def _pil_shows_itself() -> None:
    """PIL's `show()` and `save(path)` display the image: a PNG result, as E2B's kernels."""
    try:
        from PIL import Image, ImageShow
    except ImportError:
        return
    from IPython.display import display

    for viewer in getattr(ImageShow, "_viewers", []):
        if hasattr(viewer, "show_file"):
            viewer.show_file = lambda *a, **kw: 0  # no desktop viewer: the display below

    def show(self: Any, title: str | None = None) -> None:
        display(self)

    save = Image.Image.save

    def save_and_show(self: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(fp, str):
            display(self)
        return save(self, fp, *args, **kwargs)

    Image.Image.show = show
    Image.Image.save = save_and_show


STARTUP = """\
# aenv's code interpreter formatters (aenv.interpreter.formatters), installed by its server.
import importlib.util as _u
_spec = _u.spec_from_file_location("aenv_formatters", {path!r})
_m = _u.module_from_spec(_spec)
_spec.loader.exec_module(_m)
_m.install(get_ipython())
del _u, _spec, _m
"""


def write_startup(ipython_dir: Path) -> Path:
    """The startup file that loads this module into every python kernel of `ipython_dir`."""
    d = ipython_dir / "profile_default" / "startup"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "00-aenv-formatters.py"
    f.write_text(STARTUP.format(path=str(Path(__file__).resolve())))
    return f
