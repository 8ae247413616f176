"""Rich display on every backend: display(), the Jupyter repr protocol, matplotlib, the caps.

Real pandas, matplotlib and Pillow run in the kernel (they are in the dev extras, and the kernel
imports from the same site-packages as the host).
"""

from __future__ import annotations

import io
import json

from PIL import Image

from sunroom import AsyncKernel, ExecutionResult, Limits

LIMITS = Limits(timeout_s=60, memory_mb=1024)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

REPRS = """
class Rich:
    def _repr_html_(self): return '<b>hi</b>'
    def _repr_markdown_(self): return '**hi**'
    def _repr_svg_(self): return '<svg/>'
    def _repr_latex_(self): return '$x$'
    def _repr_json_(self): return {'a': [1, 2]}
    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\nfake'
    def _repr_jpeg_(self): return 'AAEC'  # base64 str, as IPython allows: decoded
    def __repr__(self): return 'Rich()'

class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {'text/html': '<i>b</i>', 'application/vnd.custom+json': {'k': 1}}, {'text/html': {'isolated': True}}

class Broken:
    def _repr_html_(self): raise ValueError('no html today')
    def _repr_png_(self): return 42
    def __repr__(self): return 'Broken()'
"""


def _item(result: ExecutionResult, index: int = 0) -> dict[str, object]:
    assert result.ok, result
    return dict(result.outputs[index].data)


async def test_display_honours_every_repr_method(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        assert (await k.execute(REPRS)).ok
        r = await k.execute("display(Rich(), Bundle())\n'after'")
        assert r.value == "'after'" and len(r.outputs) == 2 and r.dropped_outputs == 0
        rich = _item(r, 0)
        assert rich["text/html"] == "<b>hi</b>" and rich["text/markdown"] == "**hi**"
        assert rich["image/svg+xml"] == "<svg/>" and rich["text/latex"] == "$x$"
        assert rich["application/json"] == {"a": [1, 2]}
        assert rich["image/png"] == PNG_MAGIC + b"fake"
        assert rich["image/jpeg"] == b"\x00\x01\x02"
        assert rich["text/plain"] == "Rich()"
        bundle = _item(r, 1)
        assert bundle["text/html"] == "<i>b</i>"
        assert bundle["application/vnd.custom+json"] == {"k": 1}
        assert r.outputs[1].metadata == {"text/html": {"isolated": True}}
        as_json = json.loads(json.dumps(r.to_dict()))
        assert as_json["outputs"][0]["output_type"] == "display_data"
        assert as_json["outputs"][0]["data"]["image/jpeg"] == "AAEC"  # base64, as in .ipynb


async def test_a_broken_repr_is_reported_and_never_fails_the_cell(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        assert (await k.execute(REPRS)).ok
        r = await k.execute("display(Broken())\n1 + 1")
        assert r.ok and r.value == "2", r
        item = r.outputs[0]
        assert dict(item.data) == {"text/plain": "Broken()"}
        errors = item.metadata["sunroom"]["errors"]
        assert errors["text/html"] == "ValueError: no html today"
        assert "returned a int" in errors["image/png"]


async def test_a_hanging_repr_is_bounded_by_the_cell_timeout(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        code = (
            "import time\n"
            "class Slow:\n"
            "    def _repr_html_(self):\n"
            "        time.sleep(60)\n"
            "display(Slow())"
        )
        r = await k.execute(code, timeout_s=1)
        assert r.status == "timeout" and not r.state_lost, r
        assert (await k.execute("1 + 1")).value == "2"


async def test_a_trailing_value_with_rich_reprs_is_an_output(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute(
            "import pandas as pd\npd.DataFrame({'region': ['n', 's'], 'revenue': [1.5, 2.0]})"
        )
        assert r.ok, r
        assert r.value is not None and "region" in r.value  # text/plain stays the value
        html = _item(r)["text/html"]
        assert isinstance(html, str) and "<table" in html and "revenue" in html
        plain = await k.execute("[1, 2]")
        assert plain.value == "[1, 2]" and plain.outputs == ()


async def test_a_pil_image_displays_as_png(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute("from PIL import Image\nImage.new('RGB', (4, 3), 'red')")
        png = _item(r)["image/png"]
        assert isinstance(png, bytes) and png.startswith(PNG_MAGIC)
        assert Image.open(io.BytesIO(png)).size == (4, 3)


async def test_open_figures_are_captured_as_png_and_closed(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(2, 1.5), dpi=50)\n"
            "ax.plot([1, 3, 2])\n"
            "import matplotlib\n"
            "backend = matplotlib.get_backend()\n"
            "None"
        )
        png = _item(r)["image/png"]
        assert isinstance(png, bytes) and png.startswith(PNG_MAGIC)
        assert Image.open(io.BytesIO(png)).size == (100, 75)
        assert (await k.execute("backend")).value == "'module://sunroom.prelude.mplbackend'"
        after = await k.execute("plt.get_fignums()")
        assert after.value == "[]" and after.outputs == ()  # closed: not captured again


async def test_plt_show_emits_the_figures_at_once(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute(
            "import matplotlib.pyplot as plt\n"
            "for n in range(2):\n"
            "    plt.figure(figsize=(1, 1), dpi=20)\n"
            "    plt.plot([n])\n"
            "    plt.show()\n"
            "    print('shown', n)\n"
        )
        assert r.ok and r.stdout == "shown 0\nshown 1\n", r
        assert len(r.outputs) == 2
        assert all(bytes(item.data["image/png"]).startswith(PNG_MAGIC) for item in r.outputs)
        assert "non-interactive" not in r.stderr


async def test_a_figure_too_large_to_render_is_said_and_the_kernel_works(backend: str) -> None:
    """A 50,000 x 50,000 pixel figure: Agg cannot allocate it within the kernel's memory."""
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute(
            "import matplotlib.pyplot as plt\nplt.figure(figsize=(500, 500), dpi=100)\nNone"
        )
        assert r.ok, r
        text = _item(r)["text/plain"]
        assert isinstance(text, str) and "could not be rendered" in text, text
        assert "MemoryError" in text or "too large" in text  # 50k x 50k px: ~10 GB of RGBA
        assert "image/png" in r.outputs[0].metadata["sunroom"]["errors"]
        assert (await k.execute("plt.get_fignums()")).value == "[]"


async def test_caps_drop_and_count_what_does_not_fit(backend: str) -> None:
    limits = Limits(timeout_s=60, max_display_bytes=100_000)
    async with AsyncKernel(backend=backend, limits=limits) as k:
        r = await k.execute(
            "class Big:\n"
            "    def _repr_html_(self): return 'x' * 40_000\n"
            "for _ in range(5): display(Big())\n"
            "for _ in range(200): display(1)"
        )
        assert r.ok, r
        assert len(r.outputs) == 100  # 2 big ones fit the bytes, then small ones to 100 items
        assert sum(1 for item in r.outputs if "text/html" in item.data) == 2
        assert r.dropped_outputs == 3 + 200 - 98


async def test_a_cell_that_never_imports_matplotlib_loads_none_of_it(backend: str) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute("import sys\nsorted(m for m in sys.modules if 'matplotlib' in m)")
        assert r.value == "[]", r
        assert (await k.execute("display")).value is not None  # the builtin is there


def _image(result: ExecutionResult) -> Image.Image:
    png = _item(result)["image/png"]
    assert isinstance(png, bytes)
    return Image.open(io.BytesIO(png))


async def test_figures_are_rgb_when_opaque_rgba_when_not_and_renderers_are_reused(
    backend: str,
) -> None:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        draw = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(2, 1), dpi=50)\n"
        opaque = await k.execute(draw + "ax.set_title('one')\nNone")
        image = _image(opaque)
        assert image.mode == "RGB" and image.size == (100, 50)
        # the closed figure's renderer is reused by the next one of its size: a fresh drawing
        again = await k.execute(
            draw + "ax.plot([1, 2])\nr = fig.canvas.get_renderer()\n"
            "from sunroom.prelude import display as d\nlen(d.RENDERERS._free)"
        )
        assert again.value == "0", again  # taken from the pool
        second = _image(again).convert("RGB")
        assert second.tobytes() != image.tobytes()
        pooled = await k.execute("len(d.RENDERERS._free), r is d.RENDERERS._free[0][1]")
        assert pooled.value == "(1, True)", pooled
        clear = await k.execute(draw + "fig.patch.set_alpha(0)\nax.patch.set_alpha(0)\nNone")
        image = _image(clear)
        assert image.mode == "RGBA" and image.getchannel("A").getextrema()[0] == 0
        # a later savefig of a captured figure draws afresh, into its own renderer
        saved = await k.execute(
            "import io\nb = io.BytesIO()\nfig.savefig(b, format='png')\nlen(b.getvalue()) > 0"
        )
        assert saved.value == "True", saved
