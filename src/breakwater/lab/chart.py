"""Terminal charts of a run's time series: plain text, so they survive pipes, logs and CI."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["bar_chart", "downsample"]

_BLOCKS: Final = " ▁▂▃▄▅▆▇█"


def downsample(values: Sequence[int], width: int, reduce: Callable[[Sequence[int]], int] = max) -> list[int]:
    """Fold `values` into at most `width` columns, each the `reduce` (max for gauges, sum for counts)."""
    n = len(values)
    if n <= width:
        return list(values)
    return [reduce(values[i * n // width : (i + 1) * n // width]) for i in range(width)]


def bar_chart(title: str, values: Sequence[int], *, seconds_per_value: float, height: int = 6) -> list[str]:
    """A bar chart `height` rows tall with eighth-block resolution, a y scale and a time axis."""
    peak = max(values, default=0)
    lines = [f"{title} (peak {peak})"]
    scale = max(peak, 1)
    label_w = len(str(peak))
    for row in range(height, 0, -1):
        cells = []
        for v in values:
            # Fill level of this row, in eighths of a cell.
            eighths = round(v / scale * height * 8) - (row - 1) * 8
            cells.append(_BLOCKS[max(0, min(8, eighths))])
        label = str(peak) if row == height else ("0" if row == 1 else "")
        lines.append(f"{label:>{label_w}} │{''.join(cells)}")
    end_s = round(len(values) * seconds_per_value)
    axis = f"0 s{'':{max(1, len(values) - len(str(end_s)) - 5)}}{end_s} s"
    lines.append(f"{'':>{label_w}} └{'─' * len(values)}")
    lines.append(f"{'':>{label_w}}  {axis}")
    return lines
