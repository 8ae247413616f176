"""Prices per model and the cost of a call in integer micro-USD.

A :class:`Price` is in USD per million tokens, which is also micro-USD per token, so a cost
is an exact sum of ``tokens * rate`` rounded once to an integer. A model with no entry, or a
call that used a token kind whose rate is unknown (say, cache reads on a model whose cache
price is not listed), costs ``None``: never a guess presented as fact.

The :data:`DEFAULT_PRICES` table is keyed ``"<provider>:<model>"``. Override or extend it
with :meth:`PriceTable.with_prices`, or give a model its own ``price=``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import final

from .response import Usage

__all__ = ["DEFAULT_PRICES", "LongContext", "Price", "PriceTable"]


def _dec(value: Decimal | str | float | int | None) -> Decimal | None:
    if value is None or isinstance(value, Decimal):
        return value
    return Decimal(str(value))


@final
@dataclass(frozen=True, slots=True)
class LongContext:
    """A dearer tier: a call whose prompt exceeds ``above`` tokens bills wholly at ``price``."""

    above: int
    price: Price


@final
@dataclass(frozen=True, slots=True, init=False)
class Price:
    """USD per million tokens (equivalently micro-USD per token) for one model.

    ``None`` means "not published or not known"; a call that used that token kind then has
    no cost. Rates accept ``Decimal``, ``str``, ``int`` or ``float`` and are kept as
    ``Decimal``.
    """

    input: Decimal
    output: Decimal
    cache_read: Decimal | None
    cache_write: Decimal | None
    cache_write_1h: Decimal | None
    long_context: LongContext | None

    def __init__(
        self,
        *,
        input: Decimal | str | float | int,  # noqa: A002
        output: Decimal | str | float | int,
        cache_read: Decimal | str | float | int | None = None,
        cache_write: Decimal | str | float | int | None = None,
        cache_write_1h: Decimal | str | float | int | None = None,
        long_context: LongContext | None = None,
    ) -> None:
        object.__setattr__(self, "input", _dec(input))
        object.__setattr__(self, "output", _dec(output))
        object.__setattr__(self, "cache_read", _dec(cache_read))
        object.__setattr__(self, "cache_write", _dec(cache_write))
        object.__setattr__(self, "cache_write_1h", _dec(cache_write_1h))
        object.__setattr__(self, "long_context", long_context)

    def cost_micro_usd(self, usage: Usage) -> int | None:
        """Return the cost of ``usage`` in integer micro-USD (half-up), or ``None`` if unknown."""
        price = self
        if self.long_context is not None and usage.input_tokens > self.long_context.above:
            price = self.long_context.price
        write_1h = usage.cache_write_1h_tokens
        write_5m = usage.cache_write_tokens - write_1h
        uncached = max(usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens, 0)
        total = uncached * price.input + usage.output_tokens * price.output
        for tokens, rate in (
            (usage.cache_read_tokens, price.cache_read),
            (write_5m, price.cache_write),
            (write_1h, price.cache_write_1h),
        ):
            if tokens:
                if rate is None:
                    return None
                total += tokens * rate
        return int(total.quantize(Decimal(1), rounding=ROUND_HALF_UP))


_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


@final
class PriceTable:
    """An immutable mapping from ``"<provider>:<model>"`` to :class:`Price`.

    :meth:`lookup` tries the exact model name, then the name without a trailing date
    (``claude-haiku-4-5-20251001`` → ``claude-haiku-4-5``, ``gpt-4o-2024-08-06`` →
    ``gpt-4o``) and without Gemini's ``models/`` prefix. Nothing fuzzier: ``gpt-5-pro`` does
    not match ``gpt-5``.
    """

    __slots__ = ("_prices",)

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = dict(prices or {})

    def lookup(self, provider: str, model: str) -> Price | None:
        """Return the price of ``model`` at ``provider``, or ``None`` when it is not listed."""
        name = model.removeprefix("models/")
        price = self._prices.get(f"{provider}:{name}")
        if price is None:
            stripped = _DATE_SUFFIX.sub("", name)
            if stripped != name:
                price = self._prices.get(f"{provider}:{stripped}")
        return price

    def with_prices(self, prices: Mapping[str, Price]) -> PriceTable:
        """Return a new table with ``prices`` added or replacing existing entries."""
        return PriceTable({**self._prices, **prices})

    def __contains__(self, key: object) -> bool:
        return key in self._prices

    def __len__(self) -> int:
        return len(self._prices)

    def __repr__(self) -> str:
        return f"PriceTable({len(self._prices)} models)"


def _p(i: str, o: str, cr: str | None, cw: str | None = None, cw1h: str | None = None) -> Price:
    return Price(input=i, output=o, cache_read=cr, cache_write=cw, cache_write_1h=cw1h)


def _long(base: Price, above: int, tier: Price) -> Price:
    return Price(
        input=base.input,
        output=base.output,
        cache_read=base.cache_read,
        cache_write=base.cache_write,
        cache_write_1h=base.cache_write_1h,
        long_context=LongContext(above, tier),
    )


# Anthropic: https://platform.claude.com/docs/en/about-claude/pricing and
# https://platform.claude.com/docs/en/build-with-claude/prompt-caching#pricing, standard (non-
# batch) rates. Transcribed 2026-11-30 from the snapshot in genai-prices 0.2.3 (pydantic), whose
# notes cite these pages. Columns: input, output, cache read, 5-minute cache write (1.25x input),
# 1-hour cache write (2x input). Sonnet 4.5's >200k-token tier is the published long-context rate
# (the 1M beta itself was retired 2026-04-30).
_ANTHROPIC = {
    "claude-opus-4-8": _p("5", "25", "0.5", "6.25", "10"),
    "claude-opus-4-7": _p("5", "25", "0.5", "6.25", "10"),
    "claude-opus-4-6": _p("5", "25", "0.5", "6.25", "10"),
    "claude-opus-4-5": _p("5", "25", "0.5", "6.25", "10"),
    "claude-opus-4-1": _p("15", "75", "1.5", "18.75", "30"),
    "claude-opus-4-0": _p("15", "75", "1.5", "18.75", "30"),
    "claude-sonnet-4-6": _p("3", "15", "0.3", "3.75", "6"),
    "claude-sonnet-4-5": _long(
        _p("3", "15", "0.3", "3.75", "6"), 200_000, _p("6", "22.5", "0.6", "7.5", "12")
    ),
    "claude-sonnet-4-0": _p("3", "15", "0.3", "3.75", "6"),
    "claude-3-7-sonnet": _p("3", "15", "0.3", "3.75", "6"),
    "claude-haiku-4-5": _p("1", "5", "0.1", "1.25", "2"),
    "claude-3-5-haiku": _p("0.8", "4", "0.08", "1", "1.6"),
}

# OpenAI: https://developers.openai.com/api/docs/pricing, Standard tier, as verified against that
# page on 2026-10-12 per genai-prices 0.2.3's notes; transcribed 2026-11-30. Columns: input,
# output, cached input. OpenAI publishes no cache-write charge for these models. GPT-5.4/5.5:
# prompts over 272k tokens bill the whole call at 2x input and cached input and 1.5x output.
_OPENAI = {
    "gpt-5.5": _long(_p("5", "30", "0.5"), 272_000, _p("10", "45", "1")),
    "gpt-5.4": _long(_p("2.5", "15", "0.25"), 272_000, _p("5", "22.5", "0.5")),
    "gpt-5.4-mini": _p("0.75", "4.5", "0.075"),
    "gpt-5.4-nano": _p("0.2", "1.25", "0.02"),
    "gpt-5.2": _p("1.75", "14", "0.175"),
    "gpt-5.1": _p("1.25", "10", "0.125"),
    "gpt-5": _p("1.25", "10", "0.125"),
    "gpt-5-mini": _p("0.25", "2", "0.025"),
    "gpt-5-nano": _p("0.05", "0.4", "0.005"),
    "gpt-4.1": _p("2", "8", "0.5"),
    "gpt-4.1-mini": _p("0.4", "1.6", "0.1"),
    "gpt-4.1-nano": _p("0.1", "0.4", "0.025"),
    "gpt-4o": _p("2.5", "10", "1.25"),
    "gpt-4o-mini": _p("0.15", "0.6", "0.075"),
    "o3": _p("2", "8", "0.5"),
    "o4-mini": _p("1.1", "4.4", "0.275"),
}

# Gemini Developer API: https://ai.google.dev/gemini-api/docs/pricing, Standard (paid) tier,
# text/image/video input, as verified against that page on 2026-10-14 per genai-prices 0.2.3's
# notes; transcribed 2026-11-30. Columns: input, output (thinking included), context-cache read.
# Storage-hour charges for explicit caches are not per call and are not counted. Pro models:
# prompts over 200k tokens bill at the higher tier.
_GEMINI = {
    "gemini-3.1-pro-preview": _long(_p("2", "12", "0.2"), 200_000, _p("4", "18", "0.4")),
    "gemini-3-flash-preview": _p("0.5", "3", "0.05"),
    "gemini-2.5-pro": _long(_p("1.25", "10", "0.125"), 200_000, _p("2.5", "15", "0.25")),
    "gemini-2.5-flash": _p("0.3", "2.5", "0.03"),
    "gemini-2.5-flash-lite": _p("0.1", "0.4", "0.01"),
    "gemini-2.0-flash": _p("0.1", "0.4", "0.025"),
}

DEFAULT_PRICES = PriceTable(
    {f"anthropic:{k}": v for k, v in _ANTHROPIC.items()}
    | {f"openai:{k}": v for k, v in _OPENAI.items()}
    | {f"gemini:{k}": v for k, v in _GEMINI.items()}
)
"""The built-in price table. Vendors change prices: check it against the sources above."""
