"""Terminal tables (``fedmem run``, ``show``, ``compare``, ``demo``) that never truncate a number
or a file name and are never split into column groups, whatever the width (CI logs and pipes get
80 columns). How a table too wide for the terminal is shown (:func:`print_table`):

- a one-row table becomes a ``key: value`` list;
- a table of two or three rows is transposed (one column per row, one line per field);
- a longer table becomes compact: a long ``label (reason)`` cell shows its label and a footnote
  number (the reasons are listed under the table, each once), headers lose their parenthetical
  (spelled out under the table), and, only when the terminal is still too narrow, the secondary
  columns (confidence intervals, counts, chance rates, ...) are left out and named (report.md
  has them all);
- when not even that fits, one ``column: value`` line per cell.

Column widths start from the narrowest that cuts no number or word; rich wraps the text within
them (``overflow="fold"`` only for a single word wider than its column).

rich is imported where used, as before the move: ``fedmem.report`` is imported by every
experiment module (and so by Ray workers), and ``rich.console`` alone takes ~37 ms
(``python -X importtime -c "import rich.table, rich.console"``).
"""

from __future__ import annotations

import re

from fedmem.report.results import format_value


def make_console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


SHORT_CELL = 24  # cells up to this many characters are never wrapped (numbers, CIs, short labels)
SMALL_TABLE = 3  # tables of at most this many rows are transposed when they do not fit
# Columns left out first (in this order) when a compact table still does not fit: the headers they
# match are secondary to the attack, its AUC, epsilon lower bound, booking, power and verdict.
SECONDARY = ("95% CI", "CI", "n pos/neg", "success rate", "TPR@", "chance", "MAE", "true range", "channel used",
             "median", "queries", "hits")
_NUMERIC = re.compile(r"^[-+0-9.,eE\[\]()/%:<>= ]*$|^\S*$")  # numbers, CIs, ranges, single words: never wrapped
_LABELLED = re.compile(r"^(?P<label>[^()]{1,30}?) \((?P<reason>.+)\)$", re.S)


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
        lo = max(lo, w if (keep or (w <= SHORT_CELL and _NUMERIC.match(c))) else _word_width(c))
    return lo, hi


def _table_width(content_widths) -> int:
    n = len(content_widths)
    return sum(w + 2 for w in content_widths) + n + 1  # cell padding 1+1, n+1 vertical borders


def _fit(lo: list[int], hi: list[int], width: int) -> list[int]:
    """Column widths: natural when they fit, else the narrowest safe widths plus the spare room
    given one character at a time to the column squeezed the most (its width over its natural one)."""
    if _table_width(hi) <= width:
        return list(hi)
    fixed = list(lo)
    spare = width - _table_width(fixed)
    while spare > 0:
        k = min(range(len(fixed)), key=lambda i: (fixed[i] / hi[i], -hi[i]))   # the most squeezed, relatively
        if hi[k] - fixed[k] <= 0:
            break
        fixed[k] += 1
        spare -= 1
    return fixed


def _render(console, title: str, columns: list[str], rows: list[list[str]], widths: list[int]) -> None:
    from rich.table import Table as RichTable
    from rich.text import Text

    console.print(Text(title, style="bold"))   # above the table, not squeezed into its width
    rt = RichTable()
    for h, w in zip(columns, widths):
        rt.add_column(Text(h), width=w, min_width=w, overflow="fold", no_wrap=False)
    for r in rows:
        rt.add_row(*[Text(c) for c in r])
    console.print(rt)


def _short_header(h: str) -> str:
    m = _LABELLED.match(h)
    return m.group("label") if m else h


def print_table(console, title: str, columns, rows, note: str = "", keep=(0,), mark=None) -> str:
    """Print a table on ``console`` without ever cutting a number or a file name, and never in
    column groups.

    ``rows`` hold already formatted strings; columns whose index is in ``keep`` are never
    wrapped (file names, keys). ``mark`` (optional, one bool per row) marks rows with ``*`` in
    the first column (``compare``/``demo``: the rows whose values differ). Returns how it was
    shown: ``"table"`` (whole, as is), ``"compact"`` (long reasons as footnotes, headers
    shortened, possibly secondary columns left out: see the note under it), ``"transposed"`` (a
    table of a few rows, one column per row), ``"keyvalue"`` (one row, as ``key: value`` lines)
    or ``"list"`` (not even two columns fit: one ``column: value`` line each).
    """
    from rich.text import Text

    columns = [str(c) for c in columns]
    rows = [[str(v) for v in r] + [""] * (len(columns) - len(r)) for r in rows]
    if mark is not None:
        rows = [[("* " if m else "  ") + r[0], *r[1:]] for r, m in zip(rows, mark)]
    width = max(console.width, 20)
    keep = set(keep)
    ranges = [_column_widths(h, [r[j] for r in rows], j in keep) for j, h in enumerate(columns)]
    notes = [note] if note else []
    if mark is not None and any(mark):
        notes.insert(0, "* the values differ")
    if _table_width([hi for _, hi in ranges]) <= width:
        _render(console, title, columns, rows, [hi for _, hi in ranges])
        mode = "table"
    elif len(rows) == 1 and len(columns) > 1:
        console.print(Text(title, style="bold"), soft_wrap=False)
        for h, v in zip(columns, rows[0]):   # wrapped at words; a word wider than the terminal is never cut
            line = f"  {h}: {v}"
            console.print(Text(line), soft_wrap=_word_width(line) > width)
        mode = "keyvalue"
    elif 1 < len(rows) <= SMALL_TABLE and len(columns) > len(rows) + 1:
        t_columns = [columns[0], *[r[0] for r in rows]]
        t_rows = [[h, *[r[j] for r in rows]] for j, h in enumerate(columns) if j > 0]
        mode = "transposed" if _compact(console, title, t_columns, t_rows, {0}, width, notes) else "list"
        notes = []
    else:
        mode = "compact" if _compact(console, title, columns, rows, keep, width, notes) else "list"
        notes = []
    for n in notes:
        console.print(Text(n, style="dim"))
    return mode


def _compact(console, title, columns, rows, keep, width, notes) -> bool:
    """Print ``rows`` as a compact table (see the module docstring); False when it fell back to
    one ``column: value`` line per cell."""
    from rich.text import Text

    foot: dict[str, int] = {}
    short_rows = []
    for r in rows:
        out = []
        for j, c in enumerate(r):
            m = _LABELLED.match(c) if (j not in keep and j > 0 and len(c) > SHORT_CELL) else None
            if m:
                n = foot.setdefault(c, len(foot) + 1)
                c = f"{m.group('label')} [{n}]"
            out.append(c)
        short_rows.append(out)
    heads = [h if j in keep else _short_header(h) for j, h in enumerate(columns)]
    renamed = [f"{s} = {h}" for s, h in zip(heads, columns) if s != h]
    idx = list(range(len(columns)))
    ranges = {j: _column_widths(heads[j], [r[j] for r in short_rows], j in keep) for j in idx}
    for j in idx:   # a "label [n]" cell is never wrapped
        tagged = [_lines_width(r[j]) for r, o in zip(short_rows, rows) if r[j] != o[j]]
        if tagged:
            ranges[j] = (max(ranges[j][0], *tagged), ranges[j][1])
    def cramped() -> bool:   # does not fit, or squeezes a column below half its natural width
        lo, hi = [ranges[j][0] for j in idx], [ranges[j][1] for j in idx]
        if _table_width(lo) > width:
            return True
        return any(w < h / 2 for w, h in zip(_fit(lo, hi, width), hi))

    dropped = []
    for pattern in SECONDARY:
        if not cramped():
            break
        for j in list(idx):
            if j > 0 and j not in keep and pattern.lower() in columns[j].lower() and len(idx) > 2:
                idx.remove(j)
                dropped.append(columns[j])
                if not cramped():
                    break
    if _table_width([ranges[j][0] for j in idx]) > width:
        console.print(Text(title, style="bold"), soft_wrap=True)
        for r in rows:
            console.print(Text(f"- {columns[0]}: {r[0]}"), soft_wrap=True)
            for h, v in zip(columns[1:], r[1:]):
                console.print(Text(f"    {h}: {v}"), soft_wrap=True)
        for n in notes:
            console.print(Text(n, style="dim"))
        return False
    widths = _fit([ranges[j][0] for j in idx], [ranges[j][1] for j in idx], width)
    _render(console, title, [heads[j] for j in idx], [[r[j] for j in idx] for r in short_rows], widths)
    for text, n in foot.items():
        console.print(Text(f"[{n}] {text}"))
    renamed = [x for x, h in zip(renamed, [h for s, h in zip(heads, columns) if s != h])
               if columns.index(h) in idx]
    if renamed:
        console.print(Text("Columns: " + "; ".join(renamed) + ".", style="dim"))
    if dropped:
        console.print(Text(f"Not shown at this width: {', '.join(dropped)} (report.md has every column).",
                           style="dim"))
    for n in notes:
        console.print(Text(n, style="dim"))
    return True


def print_result_tables(result, console) -> bool:
    """Print a result's tables; True when every one was shown whole (every column, as is)."""
    whole = True
    for t in result.tables:
        mode = print_table(console, t.title, t.columns, [[format_value(v) for v in row] for row in t.rows], t.note,
                           keep=())
        whole = whole and mode in ("table", "keyvalue", "transposed")
    return whole
