"""The tools an agent calls: a JSON schema each (OpenAI function format) and a sandboxed implementation.

Every tool runs inside the episode's sandbox with a per-call timeout and
returns a :class:`ToolResult` whose ``output`` is already truncated for the
model (head and tail kept, a marker in the middle says how much was cut).
What the model did wrong (bad arguments, missing file, failing patch) is an
``output`` the model reads; only a failure of the sandbox machinery
(:class:`sandbox.SandboxInfraError`) propagates, so the environment can mark
the episode as an anomaly instead of scoring it.

Built-in tools: ``bash``, ``python``, ``read_file``, ``write_file``,
``apply_patch``, ``run_tests``, ``submit``. A domain picks its set by name;
:func:`register_tool` adds more.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from envs.schema import validate_arguments
from sandbox import ExecResult, SandboxFileError, SandboxUsageError

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
DEFAULT_MAX_OUTPUT_CHARS = 8000


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one tool call did, as the model and the trajectory see it."""

    output: str
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    ends_episode: bool = False
    answer: str | None = None
    error: str | None = None
    malformed: bool = False  # the arguments broke the schema: a call-format mistake, not a failed action

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.exit_code in (None, 0)


@dataclasses.dataclass(frozen=True)
class ToolContext:
    """What a tool may use: the sandbox, the task, and the call's limits."""

    sandbox: Any
    task: Any
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    # Where a tool may put a scratch file (outside the workspace, so it never shows in the agent's
    # repository). Named by the call's place in the episode, never at random: the name can appear in
    # what the model reads (a traceback), and everything the model reads must follow from the seed.
    scratch: str = "/tmp/.agentrl-scratch"


@dataclasses.dataclass(frozen=True)
class Tool:
    """A named tool: description and JSON-schema parameters for the model, ``run`` for the sandbox."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    run: Callable[[ToolContext, Mapping[str, Any]], ToolResult]

    def __post_init__(self):
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_-]{0,63}", self.name):
            raise ValueError(f"Tool.name: expected an identifier-like name, got {self.name!r}")
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise ValueError(f"Tool.parameters of {self.name!r}: expected a JSON schema with type 'object'")

    def schema(self) -> dict[str, Any]:
        """OpenAI function-tool format, which chat templates (Qwen2.5, Llama 3.1) render."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }

    def __call__(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
        """Validates ``arguments`` against the schema, then runs; model mistakes become error results."""
        problem = validate_arguments(self.parameters, arguments)
        if problem:
            return ToolResult(output=f"Error: {self.name}: {problem}", error=problem, malformed=True)
        try:
            return self.run(ctx, arguments)
        except (SandboxUsageError, SandboxFileError) as exc:
            return ToolResult(output=f"Error: {self.name}: {exc}", error=str(exc))


TOOLS: dict[str, Tool] = {}


def register_tool(tool: Tool) -> Tool:
    """Adds a tool to the registry; a name can be registered once."""
    if tool.name in TOOLS:
        raise ValueError(f"register_tool: a tool named {tool.name!r} is already registered")
    TOOLS[tool.name] = tool
    return tool


def get_tools(names: Iterable[str]) -> dict[str, Tool]:
    """The tools called ``names``, in order; a clear error lists what exists."""
    out = {}
    for name in names:
        if name not in TOOLS:
            raise KeyError(f"tools: unknown tool {name!r}; registered: {sorted(TOOLS)}")
        out[name] = TOOLS[name]
    return out


# -- output shaping -------------------------------------------------------------
def truncate_middle(text: str, limit: int) -> str:
    """Keeps the head and the tail of ``text`` (errors are usually at the end) within ``limit`` chars."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters truncated ...]\n"
    keep = max(limit - len(marker) - 8, 0)
    head, tail = (keep * 3) // 5, keep - (keep * 3) // 5
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[-tail:] if tail else "")


def format_process(result: ExecResult, limit: int, timeout_s: float) -> str:
    """One process result as the model reads it: stdout, stderr, then the status line."""
    body = result.stdout_text
    if result.stderr:
        body += ("\n" if body and not body.endswith("\n") else "") + "[stderr]\n" + result.stderr_text
    body = truncate_middle(body, limit)
    notes = []
    if result.truncated:
        notes.append("[output capped by the sandbox]")
    if result.timed_out:
        notes.append(f"[timed out after {timeout_s:g} s; the command and its children were killed]")
    if result.oom_killed:
        notes.append("[killed: out of memory]")
    notes.append(f"[exit code: {result.exit_code}]")
    return (body + ("\n" if body and not body.endswith("\n") else "") + "\n".join(notes)).lstrip("\n")


def _process_result(ctx: ToolContext, cmd: str | list[str], timeout: float, **kwargs: Any) -> ToolResult:
    start = time.monotonic()
    result = ctx.sandbox.exec(cmd, timeout=timeout, **kwargs)
    return ToolResult(
        output=format_process(result, ctx.max_output_chars, timeout),
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration_s=time.monotonic() - start,
    )


def _timeout(ctx: ToolContext, arguments: Mapping[str, Any]) -> float:
    requested = arguments.get("timeout")
    return float(min(requested, MAX_TIMEOUT_S)) if requested else ctx.timeout_s


def _scratch(ctx: ToolContext, suffix: str) -> str:
    return f"{ctx.scratch}{suffix}"


# -- the built-in tools -------------------------------------------------------------
def _bash(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    return _process_result(ctx, arguments["command"], _timeout(ctx, arguments))


def _python(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    path = _scratch(ctx, ".py")
    ctx.sandbox.write_files({path: arguments["code"]})
    try:
        return _process_result(ctx, ["python3", path], _timeout(ctx, arguments))
    finally:
        ctx.sandbox.exec(["rm", "-f", path], timeout=10)


def _read_file(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    start = time.monotonic()
    data = ctx.sandbox.read_file(arguments["path"], max_bytes=8 << 20).decode("utf-8", errors="replace")
    lines = data.splitlines(keepends=True)
    first = int(arguments.get("start_line", 1))
    last = int(arguments.get("end_line", len(lines)))
    text = "".join(lines[first - 1 : last]) if ("start_line" in arguments or "end_line" in arguments) else data
    return ToolResult(output=truncate_middle(text, ctx.max_output_chars), duration_s=time.monotonic() - start)


def _write_file(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    start = time.monotonic()
    content = arguments["content"]
    ctx.sandbox.write_files({arguments["path"]: content})
    size = len(content.encode("utf-8"))
    return ToolResult(output=f"wrote {size} bytes to {arguments['path']}", duration_s=time.monotonic() - start)


def patch_strip_level(patch: str) -> int:
    """1 for git-style ``a/`` ``b/`` headers, else 0."""
    paths = [
        line[4:].split("\t")[0].strip()
        for line in patch.splitlines()
        if line.startswith(("--- ", "+++ ")) and "/dev/null" not in line
    ]
    return 1 if paths and all(p.startswith(("a/", "b/")) for p in paths) else 0


def _apply_patch(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    patch = arguments["patch"]
    if not patch.endswith("\n"):
        patch += "\n"
    if not re.search(r"^--- ", patch, re.M) or not re.search(r"^\+\+\+ ", patch, re.M):
        msg = "the patch must be a unified diff with '--- old' and '+++ new' file headers and @@ hunks"
        return ToolResult(output=f"Error: apply_patch: {msg}", error=msg)
    path = _scratch(ctx, ".diff")
    ctx.sandbox.write_files({path: patch})
    strip = patch_strip_level(patch)
    # Dry run first, so a patch with one bad hunk changes nothing.
    base = f"patch --batch --forward --no-backup-if-mismatch -r - -p{strip} -i {shlex.quote(path)}"
    cmd = f"{base} --dry-run >/dev/null 2>&1 && {base} || {{ {base} --dry-run; exit 1; }}"
    try:
        return _process_result(ctx, cmd, ctx.timeout_s)
    finally:
        ctx.sandbox.exec(["rm", "-f", path], timeout=10)


def _run_tests(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    metadata = getattr(ctx.task, "metadata", {}) or {}
    command = metadata.get("test_command")
    if not command:
        msg = "this task has no visible test command; use bash to run what you need"
        return ToolResult(output=f"Error: run_tests: {msg}", error=msg)
    if arguments.get("target"):
        command = f"{command} {shlex.quote(arguments['target'])}"
    timeout = float(metadata.get("test_timeout_s", ctx.timeout_s))
    return _process_result(ctx, command, timeout)


def _submit(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    answer = arguments.get("answer")
    return ToolResult(output="Submitted. The episode is over.", ends_episode=True, answer=answer)


_TIMEOUT_PARAM = {"type": "number", "minimum": 1, "maximum": int(MAX_TIMEOUT_S), "description": "seconds"}
for _tool in (
    Tool(
        "bash",
        "Run a bash command in the sandbox (working directory /workspace, no network). "
        "Returns stdout, stderr and the exit code.",
        {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash script"}, "timeout": _TIMEOUT_PARAM},
            "required": ["command"],
            "additionalProperties": False,
        },
        _bash,
    ),
    Tool(
        "python",
        "Run a Python 3 program in the sandbox and return what it prints.",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source"}, "timeout": _TIMEOUT_PARAM},
            "required": ["code"],
            "additionalProperties": False,
        },
        _python,
    ),
    Tool(
        "read_file",
        "Read a text file (path relative to /workspace or absolute); optionally a 1-based line range.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        _read_file,
    ),
    Tool(
        "write_file",
        "Create or overwrite a file with the given content (parent directories are created).",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        _write_file,
    ),
    Tool(
        "apply_patch",
        "Apply a unified diff (as produced by `diff -u` or `git diff`) in /workspace. All hunks apply or none do.",
        {
            "type": "object",
            "properties": {"patch": {"type": "string", "description": "the unified diff"}},
            "required": ["patch"],
            "additionalProperties": False,
        },
        _apply_patch,
    ),
    Tool(
        "run_tests",
        "Run the task's visible test suite (optionally one file or test id) and return its report.",
        {
            "type": "object",
            "properties": {"target": {"type": "string", "description": "a test file or pytest node id"}},
            "additionalProperties": False,
        },
        _run_tests,
    ),
    Tool(
        "submit",
        "Finish the task. Pass `answer` when the task asks for one; the work in the sandbox is then graded.",
        {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "the final answer, if the task asks for one"}},
            "additionalProperties": False,
        },
        _submit,
    ),
):
    register_tool(_tool)
