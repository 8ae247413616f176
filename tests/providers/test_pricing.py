from __future__ import annotations

from decimal import Decimal

from sunroom.providers import DEFAULT_PRICES, LongContext, Price, PriceTable, Usage


def test_lookup_exact_and_dated() -> None:
    haiku = DEFAULT_PRICES.lookup("anthropic", "claude-haiku-4-5")
    assert haiku is not None and haiku.input == Decimal(1) and haiku.output == Decimal(5)
    assert DEFAULT_PRICES.lookup("anthropic", "claude-haiku-4-5-20251001") is haiku
    assert DEFAULT_PRICES.lookup("openai", "gpt-4o-2024-08-06") is DEFAULT_PRICES.lookup(
        "openai", "gpt-4o"
    )
    assert DEFAULT_PRICES.lookup("gemini", "models/gemini-2.5-flash") is not None


def test_lookup_is_never_fuzzy() -> None:
    assert DEFAULT_PRICES.lookup("openai", "gpt-5-pro") is None  # not "gpt-5"
    assert DEFAULT_PRICES.lookup("openai", "gpt-4o-mini-realtime") is None
    assert DEFAULT_PRICES.lookup("anthropic", "gpt-4o") is None  # prices are per provider
    assert DEFAULT_PRICES.lookup("openai-compatible", "gpt-4o") is None


def test_cost_is_exact_integer_micro_usd() -> None:
    price = Price(input="0.3", output="2.5", cache_read="0.03")
    usage = Usage(input_tokens=1000, output_tokens=101, cache_read_tokens=400)
    # 600 * 0.3 + 400 * 0.03 + 101 * 2.5 = 180 + 12 + 252.5 -> 444.5 -> 445 (half up)
    assert price.cost_micro_usd(usage) == 445


def test_unknown_token_kind_costs_none() -> None:
    price = Price(input=1, output=2)  # no published cache price
    assert price.cost_micro_usd(Usage(10, 10)) == 30
    assert price.cost_micro_usd(Usage(10, 10, cache_read_tokens=5)) is None
    assert price.cost_micro_usd(Usage(10, 10, cache_write_tokens=5)) is None


def test_long_context_tier_bills_whole_call() -> None:
    price = DEFAULT_PRICES.lookup("gemini", "gemini-2.5-pro")
    assert price is not None
    assert price.cost_micro_usd(Usage(200_000, 1000)) == 200_000 * 1.25 + 1000 * 10
    # 200_001 * 2.5 + 1000 * 15 = 515_002.5, rounded half up
    assert price.cost_micro_usd(Usage(200_001, 1000)) == 515_003
    custom = Price(input=1, output=1, long_context=LongContext(10, Price(input=2, output=3)))
    assert custom.cost_micro_usd(Usage(11, 1)) == 11 * 2 + 3


def test_one_hour_cache_writes() -> None:
    price = DEFAULT_PRICES.lookup("anthropic", "claude-sonnet-4-5")
    assert price is not None
    usage = Usage(
        input_tokens=1300, output_tokens=0, cache_write_tokens=300, cache_write_1h_tokens=100
    )
    assert price.cost_micro_usd(usage) == round(1000 * 3 + 200 * 3.75 + 100 * 6)


def test_user_override() -> None:
    table = DEFAULT_PRICES.with_prices(
        {"openai:gpt-4o": Price(input=0, output=0), "mine:m": Price(input=1, output=1)}
    )
    assert table.lookup("openai", "gpt-4o") == Price(input=0, output=0)
    assert "mine:m" in table and "mine:m" not in DEFAULT_PRICES
    assert len(PriceTable()) == 0 and "models" in repr(table)
