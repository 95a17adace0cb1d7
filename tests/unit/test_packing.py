from __future__ import annotations

from inferq.worker.window.packing import pack


def _len(x: int) -> int:
    return x


def test_keeps_queue_order_under_the_count_limit_and_sorts_by_length() -> None:
    packed = pack([30, 5, 12, 7], _len, max_count=3, max_tokens=None)
    assert packed.batch == [5, 12, 30]
    assert packed.rest == [7]


def test_padded_token_budget_stops_the_batch_without_skipping_ahead() -> None:
    # 3 rows x 40 = 120 fits a 128 budget; a 4th row would cost 4 x 40 = 160.
    packed = pack([10, 40, 20, 5, 1], _len, max_count=10, max_tokens=128)
    assert sorted(packed.batch) == [10, 20, 40]
    assert packed.rest == [5, 1]
    assert packed.padded_tokens == 120
    assert packed.real_tokens == 70
    assert abs(packed.padding_efficiency - 70 / 120) < 1e-12


def test_an_over_long_first_request_still_runs_alone() -> None:
    packed = pack([500, 3], _len, max_count=8, max_tokens=100)
    assert packed.batch == [500]
    assert packed.rest == [3]


def test_equal_lengths_have_perfect_padding_efficiency() -> None:
    assert pack([8, 8, 8], _len, max_count=8, max_tokens=None).padding_efficiency == 1.0
