"""Terminal tables (``fedmem run``, ``show``, ``compare``, ``demo``) that never truncate a number
or a file name, whatever the width (CI logs and pipes get 80 columns): columns are sized so
that no number or name is cut, a table too wide for the terminal is shown in column groups,
and as a list when even that fails.

rich is imported where used, as before the move: ``fedmem.report`` is imported by every
experiment module (and so by Ray workers), and ``rich.console`` alone takes ~37 ms
(``python -X importtime -c "import rich.table, rich.console"``).
"""

from __future__ import annotations

from fedmem.report.results import format_value


def make_console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


SHORT_CELL = 24  # cells up to this many characters are never wrapped (numbers, CIs, short labels)


def _lines_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


def _word_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(w) for w in text.split()), default=0)


def _column_widths(header: str, cells: list[str], keep: bool) -> tuple[int, int]:
    """(narrowest width that cuts no number, name or short cell; natural width) of one column."""
    lo = max(_word_width(header), 1)
    hi = max(_lines_width(header), 1)
    for c in cells:
        w = _lines_width(c)
        hi = max(hi, w)
        lo = max(lo, w if (keep or w <= SHORT_CELL) else _word_width(c))
    return lo, hi


def _table_width(content_widths) -> int:
    n = len(content_widths)
    return sum(w + 2 for w in content_widths) + n + 1  # cell padding 1+1, n+1 vertical borders


def print_table(console, title: str, columns, rows, note: str = "", keep=(0,)) -> str:
    """Print a table on ``console`` without ever cutting a number or a file name.

    ``rows`` hold already formatted strings; columns whose index is in ``keep`` are never
    wrapped (file names, keys). Returns how it was shown: ``"table"``, ``"groups"`` (the
    table did not fit, so it was printed in groups of columns, each repeating the first
    column) or ``"list"`` (not even two columns fit: one ``column: value`` line each).
    """
    from rich.table import Table as RichTable
    from rich.text import Text

    columns = [str(c) for c in columns]
    rows = [[str(v) for v in r] + [""] * (len(columns) - len(r)) for r in rows]
    width = max(console.width, 20)
    ranges = [_column_widths(h, [r[j] for r in rows], j in keep) for j, h in enumerate(columns)]

    def render(idx: list[int], subtitle: str) -> None:
        lo = [ranges[j][0] for j in idx]
        hi = [ranges[j][1] for j in idx]
        if _table_width(hi) <= width:
            fixed = hi
        else:  # start from the narrowest safe widths, give the spare room to the widest wants
            fixed = list(lo)
            spare = width - _table_width(fixed)
            while spare > 0:
                k = max(range(len(idx)), key=lambda i: hi[i] - fixed[i])
                if hi[k] - fixed[k] <= 0:
                    break
                fixed[k] += 1
                spare -= 1
        rt = RichTable(title=Text(title + subtitle), title_justify="left")
        for j, w in zip(idx, fixed):
            rt.add_column(Text(columns[j]), width=w, overflow="fold", no_wrap=False)
        for r in rows:
            rt.add_row(*[Text(r[j]) for j in idx])
        console.print(rt)

    all_idx = list(range(len(columns)))
    mode = "table"
    if _table_width([lo for lo, _ in ranges]) <= width:
        render(all_idx, "")
    else:
        groups, current = [], [0]
        for j in all_idx[1:]:
            if _table_width([ranges[i][0] for i in current + [j]]) <= width:
                current.append(j)
            elif len(current) > 1:
                groups.append(current)
                current = [0, j]
                if _table_width([ranges[i][0] for i in current]) > width:
                    groups = None
                    break
            else:
                groups = None
                break
        if groups is not None and len(current) > 1:
            groups.append(current)
        if groups:
            mode = "groups"
            n = len(columns)
            for g in groups:
                render(g, f" (columns {g[1] + 1}-{g[-1] + 1} of {n})" if len(g) > 2 else f" (column {g[1] + 1} of {n})")
        else:
            mode = "list"
            console.print(Text(title, style="bold"), soft_wrap=True)
            for r in rows:
                console.print(Text(f"- {columns[0]}: {r[0]}"), soft_wrap=True)
                for h, v in zip(columns[1:], r[1:]):
                    console.print(Text(f"    {h}: {v}"), soft_wrap=True)
    if note:
        console.print(Text(note, style="dim"))
    return mode


def print_result_tables(result, console) -> bool:
    """Print a result's tables; True when every one fitted as a single table."""
    whole = True
    for t in result.tables:
        mode = print_table(console, t.title, t.columns, [[format_value(v) for v in row] for row in t.rows], t.note)
        whole = whole and mode == "table"
    return whole
