"""A small table pipeline runner: CSV inputs -> declarative steps -> one CSV or JSON output.

    python3 runner.py pipeline.yaml            # paths in the config are relative to its directory

The data-pipeline tasks ship this file as ``runner.py`` next to a broken
``pipeline.yaml``; the agent fixes the config (never this file: grading runs a
pristine copy). Config (YAML or JSON)::

    inputs:                      # table name -> CSV file under data/ (header row required)
      sales: {path: data/sales.csv}
      stores: {path: data/stores.csv}
    steps:                       # run in order; each reads `input` and writes `output` (default: input)
      - {op: cast, input: sales, columns: {units: int, unit_price: float}}
      - {op: filter, input: sales, where: [{column: units, op: gt, value: 0}], mode: all}
      - {op: derive, input: sales, column: amount, expr: "units * unit_price"}
      - {op: join, input: sales, right: stores, left_on: store, right_on: store_id, how: left}
      - {op: aggregate, input: sales, output: by_city, group_by: [city],
         aggregations: {turnover: {fn: sum, column: amount}, n: {fn: count}}}
      - {op: sort, input: by_city, by: [{column: turnover, descending: true}]}
    output: {table: by_city, path: out/report.csv, columns: [city, turnover, n], format: csv}

Ops: ``cast`` (int, float, str, bool), ``filter`` (eq, ne, lt, le, gt, ge, in,
not_in, contains, startswith, endswith, is_null, not_null; ``mode`` all|any),
``select``, ``drop``, ``rename``, ``derive`` (arithmetic on columns and
literals, ``round``/``abs``/``min``/``max``/``upper``/``lower``/``strip``/
``len``/``str``/``int``/``float``, string ``+``), ``fill_null``, ``join`` (inner,
left; ``key`` or ``left_on``/``right_on``; not ``on``, which YAML reads as true), ``aggregate`` (sum, count, mean, min,
max, count_distinct, first), ``dedupe`` (``columns``, keeps the first), ``sort``
(stable, multi-key), ``limit``. Floats are written with ``repr`` after
rounding to ``output.float_digits`` (default 2). Empty CSV cells are null.
Standard library (+ PyYAML for YAML configs); Python >= 3.8.
"""

import ast
import csv
import io
import json
import os
import sys


class PipelineError(Exception):
    pass


def load_config(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        config = yaml.safe_load(text)
    else:
        config = json.loads(text)
    if not isinstance(config, dict):
        raise PipelineError("the config must be a mapping with inputs, steps and output")
    return config


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [{k: (v if v != "" else None) for k, v in row.items()} for row in rows]


def _safe_path(root, rel, where, prefix):
    if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/") or not rel.startswith(prefix):
        raise PipelineError(f"{where}: path must be relative and under {prefix}, got {rel!r}")
    return os.path.join(root, rel)


CASTS = {
    "int": lambda v: int(float(v)) if isinstance(v, str) and "." in v else int(v),
    "float": float,
    "str": str,
    "bool": lambda v: v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "y"),
}

COMPARE = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a is not None and a < b,
    "le": lambda a, b: a is not None and a <= b,
    "gt": lambda a, b: a is not None and a > b,
    "ge": lambda a, b: a is not None and a >= b,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
    "contains": lambda a, b: a is not None and str(b) in str(a),
    "startswith": lambda a, b: a is not None and str(a).startswith(str(b)),
    "endswith": lambda a, b: a is not None and str(a).endswith(str(b)),
    "is_null": lambda a, b: a is None,
    "not_null": lambda a, b: a is not None,
}

FUNCTIONS = {
    "round": round,
    "abs": abs,
    "min": min,
    "max": max,
    "upper": lambda s: str(s).upper(),
    "lower": lambda s: str(s).lower(),
    "strip": lambda s: str(s).strip(),
    "len": len,
    "str": str,
    "int": int,
    "float": float,
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def evaluate(expr, row):
    """Evaluates an arithmetic expression over a row's columns; anything else is refused."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in row:
                raise PipelineError(f"derive: unknown column {node.id!r} in {expr!r}")
            return row[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if left is None or right is None:
                return None
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = ev(node.operand)
            return None if value is None else -value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
            if node.keywords:
                raise PipelineError(f"derive: keyword arguments are not supported in {expr!r}")
            args = [ev(a) for a in node.args]
            return None if any(a is None for a in args) else FUNCTIONS[node.func.id](*args)
        raise PipelineError(f"derive: unsupported expression {expr!r}")

    try:
        return ev(ast.parse(str(expr), mode="eval"))
    except SyntaxError as exc:
        raise PipelineError(f"derive: cannot parse {expr!r}: {exc.msg}") from None


def _column(rows, name, where):
    if rows and name not in rows[0]:
        raise PipelineError("{}: unknown column {!r} (columns: {})".format(where, name, ", ".join(rows[0])))


def _sort_key(value):
    return (value is not None, value if value is not None else 0)


def aggregate(rows, group_by, aggregations):
    groups = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in group_by), []).append(row)
    out = []
    for key, members in groups.items():
        result = dict(zip(group_by, key, strict=False))
        for name, spec in aggregations.items():
            fn, col = spec.get("fn"), spec.get("column")
            values = [m[col] for m in members if m.get(col) is not None] if col else members
            if fn == "count":
                result[name] = len(values)
            elif fn == "count_distinct":
                result[name] = len(set(values))
            elif fn == "sum":
                result[name] = sum(values) if values else 0
            elif fn == "mean":
                result[name] = sum(values) / len(values) if values else None
            elif fn in ("min", "max"):
                result[name] = (min if fn == "min" else max)(values) if values else None
            elif fn == "first":
                result[name] = values[0] if values else None
            else:
                raise PipelineError(f"aggregate: unknown fn {fn!r} for {name!r}")
        out.append(result)
    return out


def run_step(step, tables):
    op, name = step.get("op"), step.get("input")
    if name not in tables:
        raise PipelineError("step {}: unknown input table {!r} (tables: {})".format(op, name, ", ".join(tables)))
    rows = [dict(r) for r in tables[name]]
    where = f"step {op}({name})"
    if op == "cast":
        for col, kind in step["columns"].items():
            _column(rows, col, where)
            if kind not in CASTS:
                raise PipelineError(f"{where}: unknown type {kind!r}")
            for row in rows:
                try:
                    row[col] = None if row[col] is None else CASTS[kind](row[col])
                except ValueError:
                    raise PipelineError(f"{where}: cannot cast {row[col]!r} in {col!r} to {kind}") from None
    elif op == "filter":
        conds = step.get("where", [])
        for c in conds:
            _column(rows, c["column"], where)
            if c.get("op") not in COMPARE:
                raise PipelineError("{}: unknown comparison {!r}".format(where, c.get("op")))
        combine = all if step.get("mode", "all") == "all" else any
        rows = [r for r in rows if combine(COMPARE[c["op"]](r[c["column"]], c.get("value")) for c in conds)]
    elif op in ("select", "drop"):
        for col in step["columns"]:
            _column(rows, col, where)
        keep = step["columns"] if op == "select" else [c for c in (rows[0] if rows else []) if c not in step["columns"]]
        rows = [{c: r[c] for c in keep} for r in rows]
    elif op == "rename":
        for old in step["columns"]:
            _column(rows, old, where)
        rows = [{step["columns"].get(k, k): v for k, v in r.items()} for r in rows]
    elif op == "derive":
        for row in rows:
            row[step["column"]] = evaluate(step["expr"], row)
    elif op == "fill_null":
        for row in rows:
            for col, value in step["columns"].items():
                if row.get(col) is None:
                    row[col] = value
    elif op == "join":
        right = tables.get(step.get("right"))
        if right is None:
            raise PipelineError("{}: unknown right table {!r}".format(where, step.get("right")))
        left_on = step.get("left_on", step.get("key"))
        right_on = step.get("right_on", step.get("key"))
        _column(rows, left_on, where)
        _column(right, right_on, where + " right side")
        index = {}
        for r in right:
            index.setdefault(r[right_on], []).append(r)
        joined = []
        for row in rows:
            matches = index.get(row[left_on], [])
            for m in matches:
                joined.append(dict(row, **{k: v for k, v in m.items() if k != right_on or right_on != left_on}))
            if not matches and step.get("how", "inner") == "left":
                joined.append(dict(row, **{k: None for k in (right[0] if right else {}) if k not in row}))
        rows = joined
    elif op == "aggregate":
        for col in step.get("group_by", []):
            _column(rows, col, where)
        rows = aggregate(rows, step.get("group_by", []), step.get("aggregations", {}))
    elif op == "dedupe":
        seen, kept = set(), []
        for row in rows:
            key = tuple(row[c] for c in step.get("columns", list(row)))
            if key not in seen:
                seen.add(key)
                kept.append(row)
        rows = kept
    elif op == "sort":
        for spec in reversed(step["by"]):
            _column(rows, spec["column"], where)
            rows.sort(key=lambda r, c=spec["column"]: _sort_key(r[c]), reverse=bool(spec.get("descending")))
    elif op == "limit":
        rows = rows[: int(step["n"])]
    else:
        raise PipelineError(f"unknown op {op!r}")
    tables[step.get("output", name)] = rows


def format_value(value, digits):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        value = round(value, digits)
        return repr(int(value)) + ".0" if value.is_integer() else repr(value)
    return str(value)


def run(config_path):
    root = os.path.dirname(os.path.abspath(config_path))
    config = load_config(config_path)
    tables = {}
    for name, spec in (config.get("inputs") or {}).items():
        tables[name] = read_csv(_safe_path(root, spec.get("path"), f"inputs.{name}", "data/"))
    for step in config.get("steps") or []:
        run_step(step, tables)
    out = config.get("output") or {}
    table = tables.get(out.get("table"))
    if table is None:
        raise PipelineError("output.table: unknown table {!r}".format(out.get("table")))
    columns = out.get("columns") or (list(table[0]) if table else [])
    _ = [_column(table, c, "output") for c in columns]
    digits = int(out.get("float_digits", 2))
    path = _safe_path(root, out.get("path", "out/result.csv"), "output.path", "out/")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if out.get("format", "csv") == "json":
        records = [{c: format_value(r[c], digits) for c in columns} for r in table]
        text = json.dumps(records, indent=1) + "\n"
    else:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for r in table:
            writer.writerow([format_value(r[c], digits) for c in columns])
        text = buf.getvalue()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path, len(table)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 runner.py CONFIG")
    try:
        path, n = run(sys.argv[1])
    except (PipelineError, KeyError, TypeError, ValueError, OSError) as exc:
        sys.exit(f"pipeline error: {type(exc).__name__}: {exc}")
    print(f"wrote {n} rows to {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
