"""E2B's sandbox behaviour in a real kernel: raw display, the execute_result mark, display
formatters, and sunroom.prelude.e2b (env vars per execution, DataFrame data, JSON, Pillow).

The cells of E2B's own SDK tests (images, data, display data, env vars) run here as their users
write them; real pandas, numpy, matplotlib and Pillow run in a bwrap kernel.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import pytest
from PIL import Image

from sunroom import AsyncKernel, ExecutionResult, Limits
from sunroom.sandbox.result import DisplayItem
from tests.conftest import _require

LIMITS = Limits(timeout_s=60, memory_mb=1024)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAIN = {"sunroom": {"execute_result": True}}
E2B = "__import__('sunroom.prelude.e2b', fromlist=['{0}']).{0}"
HEAVY = "sorted(m for m in sys.modules if m.split('.')[0] in ('PIL', 'pandas', 'numpy'))"


@pytest.fixture
def bwrap() -> str:
    """The default isolated backend (skipped where unavailable, unless CI requires it)."""
    return _require("bwrap")


@pytest.fixture
async def kernel(bwrap: str) -> AsyncIterator[AsyncKernel]:
    """A bwrap kernel as sunroom starts it (no E2B set-up)."""
    async with AsyncKernel(backend=bwrap, limits=LIMITS) as k:
        yield k


@pytest.fixture
async def sandbox(bwrap: str) -> AsyncIterator[AsyncKernel]:
    """A bwrap kernel set up as the E2B facade sets up a sandbox's (no env vars)."""
    async with AsyncKernel(backend=bwrap, limits=LIMITS) as k:
        await installed(k)
        yield k


async def run(kernel: AsyncKernel, code: str) -> ExecutionResult:
    result = await kernel.execute(code)
    assert result.ok, result
    return result


async def installed(kernel: AsyncKernel, envs: dict[str, str] | None = None) -> None:
    result = await run(kernel, E2B.format("install") + f"({envs or {}!r})")
    assert result.value is not None and result.value.startswith("'/"), result  # the cwd


async def main_item(kernel: AsyncKernel, code: str) -> DisplayItem:
    """The one item of *code*'s cell: its trailing value's, marked execute_result."""
    (item,) = (await run(kernel, code)).outputs
    assert item.metadata == MAIN, item
    return item


def png_of(item: DisplayItem) -> Image.Image:
    png = item.data["image/png"]
    assert isinstance(png, bytes) and png.startswith(PNG_MAGIC)
    return Image.open(io.BytesIO(png))


async def test_raw_display_shows_each_bundle_as_it_is(kernel: AsyncKernel) -> None:
    r = await run(kernel, "display({'text/latex': r'\\text{CustomReprObject}'}, raw=True)")
    assert [dict(i.data) for i in r.outputs] == [
        {"text/latex": "\\text{CustomReprObject}", "text/plain": ""}
    ]
    assert r.outputs[0].metadata == {}
    r = await run(
        kernel,
        "display({'text/html': 5, 'text/plain': 'p', 'image/png': b'\\x89PNG'},"
        " [1], raw=True, metadata={'k': 1})\n'after'",
    )
    assert r.value == "'after'" and len(r.outputs) == 2
    first, second = r.outputs
    assert dict(first.data) == {"text/plain": "p", "image/png": b"\x89PNG"}
    assert first.metadata == {
        "sunroom": {"errors": {"text/html": "a int is not a text/html value"}},
        "k": 1,
    }
    assert dict(second.data) == {"text/plain": ""}
    assert second.metadata["sunroom"]["errors"] == {"raw": "a list is not a mime bundle (a dict)"}


async def test_the_trailing_values_item_is_marked_execute_result(kernel: AsyncKernel) -> None:
    await run(
        kernel,
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>r</b>'\n"
        "class Broken:\n"
        "    def _repr_html_(self): raise ValueError('no html')\n",
    )
    r = await run(kernel, "display(Rich())\nRich()")
    assert [i.metadata for i in r.outputs] == [{}, MAIN]
    assert all(i.data["text/html"] == "<b>r</b>" for i in r.outputs)
    broken = await run(kernel, "Broken()")
    assert broken.outputs[0].metadata == {
        "sunroom": {"errors": {"text/html": "ValueError: no html"}, "execute_result": True}
    }
    plain = await run(kernel, "{'a': [1, 2]}")  # no formatter for it outside an E2B sandbox
    assert plain.value == "{'a': [1, 2]}" and plain.outputs == ()


async def test_formatters_add_mime_types_after_the_repr_methods(kernel: AsyncKernel) -> None:
    await run(
        kernel,
        "from sunroom.prelude import display as d\n"
        "def length(o): return str(len(o)) if isinstance(o, str) else None\n"
        "def fail(o): raise RuntimeError('formatter down')\n"
        "d.add_formatter('text/x-length', length)\n"
        "d.add_formatter('image/png', lambda o: 5 if isinstance(o, str) else None)\n"
        "d.add_formatter('text/html', lambda o: '<i>from formatter</i>')\n"
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>own</b>'",
    )
    r = await run(kernel, "display('abc')\nRich()")
    shown, main = r.outputs
    assert dict(shown.data) == {
        "text/x-length": "3",
        "text/html": "<i>from formatter</i>",
        "text/plain": "'abc'",
    }
    assert shown.metadata == {
        "sunroom": {"errors": {"image/png": "the image/png formatter returned a int"}}
    }
    assert main.data["text/html"] == "<b>own</b>" and main.metadata == MAIN  # its own wins
    trailing = await run(kernel, "d.add_formatter('text/html', fail)\n'abcd'")
    assert trailing.value == "'abcd'"
    (item,) = trailing.outputs
    assert item.data["text/x-length"] == "4" and "text/html" not in item.data
    assert item.metadata["sunroom"]["errors"]["text/html"] == "RuntimeError: formatter down"
    assert item.metadata["sunroom"]["execute_result"] is True
    for mime in ("text/x-length", "image/png", "text/html"):
        await run(kernel, f"d.remove_formatter({mime!r})")
    assert (await run(kernel, "'abcd'")).outputs == ()


async def test_install_imports_nothing_heavy_and_twice_is_once(bwrap: str) -> None:
    async with AsyncKernel(backend=bwrap, limits=LIMITS) as k:
        assert (await run(k, f"import sys\n{HEAVY}")).value == "[]"
        await installed(k, {"SANDBOX_VAR": "one"})
        await installed(k, {"SANDBOX_VAR": "one"})
        assert (await run(k, HEAVY)).value == "[]"
        state = await run(
            k,
            "from sunroom.prelude import display as d, postimport as p\n"
            "from PIL import Image, ImageShow\n"
            "from sunroom.prelude.e2b import DisplayViewer\n"
            "(sys.meta_path.count(p.FINDER), sorted(d._FORMATTERS),"
            " sum(isinstance(v, DisplayViewer) for v in ImageShow._viewers),"
            " hasattr(Image.Image.save.__wrapped__, '__wrapped__'),"
            " __import__('os').environ['SANDBOX_VAR'])",
        )
        assert state.value == "(1, ['application/json', 'e2b/data'], 1, False, 'one')", state
        assert "install" not in (await run(k, "sorted(globals())")).value  # type: ignore[operator]


async def test_pillow_loaded_before_install_is_patched_at_once_and_again_on_reload(
    bwrap: str,
) -> None:
    async with AsyncKernel(backend=bwrap, limits=LIMITS) as k:
        await run(
            k, "from PIL import Image, ImageShow\nimport importlib\nimport IPython.display as ipd"
        )
        await installed(k)
        r = await run(k, "Image.new('RGB', (2, 2)).show()")
        assert len(r.outputs) == 1 and png_of(r.outputs[0]).size == (2, 2)
        reloaded = await run(
            k,
            "ImageShow = importlib.reload(ImageShow)\n"
            "[type(v).__name__ for v in ImageShow._viewers].count('DisplayViewer'),"
            " type(ImageShow._viewers[0]).__name__",
        )
        assert reloaded.value == "(1, 'DisplayViewer')", reloaded
        uninstalled = await run(
            k,
            E2B.format("uninstall") + "()\n"
            "from sunroom.prelude import postimport as p\n"
            "import sys\n"
            "(p.FINDER in sys.meta_path, hasattr(Image.Image.save, '__wrapped__'),"
            " [type(v).__name__ for v in ImageShow._viewers].count('DisplayViewer'),"
            " hasattr(ipd.display, '__wrapped__'))",
        )
        assert uninstalled.value == "(False, False, 0, False)", uninstalled
        printed = await run(k, "ipd.display('as IPython does outside its shell')")
        assert printed.stdout == "as IPython does outside its shell\n" and printed.outputs == ()


async def test_e2b_image_tests_show_save_and_a_trailing_image_give_png(
    sandbox: AsyncKernel,
) -> None:
    make = (
        "import numpy\n"
        "from PIL import Image\n"
        "imarray = numpy.random.rand(16,16,3) * 255\n"
        "image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')\n"
    )
    shown = await run(sandbox, make + "image.show()\nprint('Image shown.')")
    assert shown.stdout == "Image shown.\n" and len(shown.outputs) == 1
    assert png_of(shown.outputs[0]).size == (16, 16) and shown.outputs[0].metadata == {}
    saved = await run(
        sandbox, make + "image.save('test.png')\nprint('Image saved.')\nImage.open('test.png').size"
    )
    assert saved.value == "(16, 16)" and len(saved.outputs) == 1
    assert png_of(saved.outputs[0]).size == (16, 16)
    into_a_buffer = await run(sandbox, "import io\nimage.save(io.BytesIO(), 'png')")
    assert into_a_buffer.outputs == ()  # only a str path displays, as in E2B's template
    assert png_of(await main_item(sandbox, make + "image")).size == (16, 16)


async def test_a_dataframe_gets_e2b_data_as_json_text(sandbox: AsyncKernel) -> None:
    item = await main_item(
        sandbox,
        "import pandas as pd, numpy as np\n"
        "pd.DataFrame({'a': [1, 2, 3], 'when': pd.to_datetime(['2024-01-02 00:00', None, "
        "'2024-03-04 05:06']), 'x': [0.5, np.nan, np.float32(2)], 5: ['p', None, 'q']})",
    )
    assert "<table" in str(item.data["text/html"])
    text = item.data["e2b/data"]
    assert isinstance(text, str)
    assert json.loads(text) == {
        "a": [1, 2, 3],
        "when": ["2024-01-02T00:00:00", None, "2024-03-04T05:06:00"],
        "x": [0.5, None, 2.0],
        "5": ["p", None, "q"],
    }
    shown = await run(sandbox, "display(pd.DataFrame({'a': [1]}))")
    assert json.loads(str(shown.outputs[0].data["e2b/data"])) == {"a": [1]}
    big = await run(sandbox, "pd.DataFrame({'a': range(300_000)})")
    (item,) = big.outputs
    assert "e2b/data" not in item.data and "<table" in str(item.data["text/html"])
    assert "300,000 cells" in item.metadata["sunroom"]["errors"]["e2b/data"]


async def test_a_dict_or_list_gets_application_json_when_it_is_json(sandbox: AsyncKernel) -> None:
    item = await main_item(
        sandbox,
        "import numpy as np, datetime\n"
        "{'n': np.int64(3), 'v': np.arange(3), 'f': float('inf'), 1: (True, None),"
        " 'd': datetime.date(2024, 1, 2)}",
    )
    assert item.data["application/json"] == {
        "n": 3,
        "v": [0, 1, 2],
        "f": None,
        "1": [True, None],
        "d": "2024-01-02",
    }
    assert dict((await main_item(sandbox, "[1, 'a']")).data) == {
        "application/json": [1, "a"],
        "text/plain": "[1, 'a']",
    }
    not_json = await run(sandbox, "[object, {1, 2}]")
    assert not_json.value is not None and not_json.outputs == ()  # plain, as E2B's
    for plain in ("(1, 2)", "'text'", "3"):
        assert (await run(sandbox, plain)).outputs == ()
    big = await run(sandbox, "list(range(20_000))")
    (item,) = big.outputs
    assert "application/json" not in item.data
    assert "more than 10,000 values" in item.metadata["sunroom"]["errors"]["application/json"]


async def test_env_vars_per_execution_restore_absent_and_default_vars(bwrap: str) -> None:
    async with AsyncKernel(backend=bwrap, limits=LIMITS) as k:
        await installed(k, {"TEST_ENV_VAR": "supertest"})
        get = "import os; os.getenv('TEST_ENV_VAR'), os.getenv('FOO', 'default')"
        assert (await run(k, get)).value == "('supertest', 'default')"
        await run(k, E2B.format("push_env") + "({'TEST_ENV_VAR': 'overwrite', 'FOO': 'bar'})")
        assert (await run(k, get)).value == "('overwrite', 'bar')"
        await run(k, E2B.format("pop_env") + "()")
        assert (await run(k, get)).value == "('supertest', 'default')"
        # a push whose pop never came is undone by the next push; a pop too many does nothing
        await run(k, E2B.format("push_env") + "({'FOO': 'first'})")
        await run(k, E2B.format("push_env") + "({'TEST_ENV_VAR': 'second'})")
        assert (await run(k, get)).value == "('second', 'default')"
        await run(k, E2B.format("pop_env") + "()\n" + E2B.format("pop_env") + "()")
        assert (await run(k, get)).value == "('supertest', 'default')"
        assert (
            await run(k, E2B.format("defaults") + "()")
        ).value == "{'TEST_ENV_VAR': 'supertest'}"
        bad = await k.execute(E2B.format("push_env") + "({'FOO': 1})")
        assert bad.error is not None and bad.error.type == "TypeError"
        assert (await run(k, get)).value == "('supertest', 'default')"


async def test_plt_show_gives_one_png_item_with_text(sandbox: AsyncKernel) -> None:
    """E2B's test_display_data: the figure's item has png and text, and nothing else."""
    r = await run(
        sandbox,
        "import matplotlib.pyplot as plt\n"
        "import numpy as np\n"
        "x = np.linspace(0, 20, 100)\n"
        "y = np.sin(x)\n"
        "plt.plot(x, y)\n"
        "plt.show()\n",
    )
    (item,) = r.outputs
    assert sorted(item.data) == ["image/png", "text/plain"]
    assert item.data["text/plain"] == "<Figure size 640x480 with 1 Axes>"
    assert png_of(item).size == (640, 480) and item.metadata == {}


@pytest.mark.parametrize("loaded_before_install", [False, True])
async def test_ipythons_display_shows_through_sunroom(
    bwrap: str, loaded_before_install: bool
) -> None:
    """E2B's test_custom_repr_object: IPython's display, raw, in a kernel that is not IPython."""
    async with AsyncKernel(backend=bwrap, limits=LIMITS) as k:
        if loaded_before_install:
            await run(k, "import IPython.display")
        await installed(k)
        r = await run(
            k,
            "from IPython.display import display, Markdown\n"
            "display({'text/latex': r'\\text{CustomReprObject}'}, raw=True)\n"
            "display(Markdown('**m**'), metadata={'k': 1}, display_id=None)\n"
            "import IPython.core.display as core\n"
            "core.display_html('<b>h</b>', raw=True)",
        )
        assert r.stdout == ""  # IPython outside its shell would print the objects
        assert [dict(i.data) for i in r.outputs] == [
            {"text/latex": "\\text{CustomReprObject}", "text/plain": ""},
            {"text/markdown": "**m**", "text/plain": "<IPython.core.display.Markdown object>"},
            {"text/html": "<b>h</b>", "text/plain": ""},
        ]
        assert [i.metadata for i in r.outputs] == [{}, {"k": 1}, {}]


async def test_pip_install_of_an_installed_package_says_so_as_pip_does(
    sandbox: AsyncKernel,
) -> None:
    r = await run(sandbox, E2B.format("pip_install") + "(['numpy', 'Pillow'])")
    lines = r.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "Requirement already satisfied: numpy",
        "Requirement already satisfied: Pillow",
    ]
    assert r.value is None and r.outputs == ()
    bad = await sandbox.execute(E2B.format("pip_install") + "(['--no-deps x'])")
    assert bad.error is not None and bad.error.type == "ValueError", bad


@pytest.fixture
def jupyter() -> str:
    """The jupyter backend (an IPython kernel in bwrap)."""
    return _require("jupyter")


async def test_on_the_jupyter_backend_pillow_shows_through_ipython(jupyter: str) -> None:
    async with AsyncKernel(backend=jupyter, limits=LIMITS) as k:
        await installed(k, {"SANDBOX_VAR": "one"})
        r = await run(
            k,
            "from PIL import Image\n"
            "image = Image.new('RGB', (3, 2))\n"
            "image.show()\n"
            "image.save('x.png')\n"
            "from IPython.display import display\n"
            "display({'text/latex': '$x$'}, raw=True)\n"
            "import os\n"
            "os.environ['SANDBOX_VAR']",
        )
        assert r.value == "'one'"
        images, latex = r.outputs[:2], r.outputs[2]
        assert [png_of(i).size for i in images] == [(3, 2), (3, 2)]
        assert latex.data["text/latex"] == "$x$"  # IPython's own display, in its shell
