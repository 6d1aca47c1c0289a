"""The task file: what an upstream pipeline submits (YAML or JSON), validated once at intake.

``orga schema`` prints the JSON Schema of :class:`TaskSpec`. Unknown fields are errors, so a typo
is reported instead of silently ignored. Secrets never go in a task file: API keys are read from
the environment of the worker processes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.context_manager import ContextStrategy, SlidingWindow
from shared.conventions import KnowledgeSpec
from shared.delegation import ParentLink, WorkspaceMode
from shared.durations import Duration, DurationDefaultsSchema
from shared.errors import OrgaError
from shared.identical import SharedWhenIdentical, shared_default
from shared.loop_types import LoopConfig, RecoveryStrategy, Retry
from shared.mcp import McpServerSpec, check_no_credentials, check_unique_names
from shared.policy import PolicySpec
from shared.pre_hydration import PreHydrationConfig
from shared.pricing import ModelPricing, price_of, unpriced_message
from shared.progress_tracker import StepIterationConfig
from shared.stagnation import StagnationConfig
from shared.tool_profile import ToolProfile

__all__ = [
    "AGENT_NAME_PATTERN",
    "MAX_TASK_BYTES",
    "MAX_TASK_DEPTH",
    "MAX_TASK_ID_CHARS",
    "MAX_TASK_VALUES",
    "TASK_ID_PATTERN",
    "CriticSpec",
    "DoneWhen",
    "ProviderSpec",
    "ReviewSpec",
    "StepSpec",
    "TaskLimits",
    "TaskSpec",
    "TaskSpecError",
    "as_task_text",
    "check_task_id",
    "decode_task_text",
    "load_task_file",
    "parse_task",
    "parse_task_text",
    "task_json_schema",
    "task_workspace",
]

MAX_TASK_BYTES = 1_048_576
"""A submitted task larger than this is rejected before parsing."""

MAX_TASK_DEPTH = 32
"""Lists and mappings nested deeper than this are rejected (the stored record must stay JSON
that every reader can parse; pydantic's JSON parser stops at 200 levels)."""

MAX_TASK_VALUES = 100_000
"""A task holding more values than this is rejected; YAML aliases count every time they are
used, so a few hundred bytes of anchors cannot expand into billions of values."""

_STEP_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

AGENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""A registered agent's name (``agent: NAME`` in a task; :mod:`shared.agent_profile`)."""
MAX_TASK_ID_CHARS = 128
"""A task id is at most this long (it names Redis keys, a workspace folder and every event)."""

TASK_ID_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_TASK_ID_CHARS - 1}}}")
"""A task id: a letter or digit, then letters, digits, ``.``, ``_`` or ``-``. So never ``.``,
``..``, a path separator, whitespace or control characters: the id is one folder name under
``ORGA_WORKSPACE_ROOT``."""


class TaskSpecError(OrgaError, ValueError):
    """A task file or payload is not a valid task; the message names the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DoneWhen(_Strict):
    """A check that makes a step's completion a *verified milestone*: a command in the workspace.

    A plain string is accepted as ``{command: <string>}``.
    """

    command: str = Field(min_length=1)
    expect_exit_code: int = 0
    timeout: Duration = timedelta(seconds=60)

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"command": value} if isinstance(value, str) else value


class StepSpec(_Strict):
    """One step of a task: an instruction and, optionally, how to verify it is done and who
    reviews its result (a critic)."""

    id: str = Field(pattern=_STEP_ID)
    instruction: str = Field(min_length=1)
    done_when: DoneWhen | None = None
    max_iterations: int | None = Field(default=None, ge=1)
    critic: CriticSpec | None = None


class ProviderSpec(_Strict):
    """Which model answers. API keys come from the environment, never from the task file."""

    kind: Literal["scripted", "openai", "openrouter", "anthropic"] | None = None
    model: str | None = None
    base_url: str | None = None
    script: str | None = None
    replies: list[dict[str, Any] | str] | None = None
    pricing: ModelPricing | None = None
    """USD per million tokens of this model, for a model the price table (genai-prices) does
    not know or to override it: ``{input_per_mtok, output_per_mtok}``."""

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, value: Any) -> Any:
        if isinstance(value, dict):
            secret = next((k for k in value if isinstance(k, str) and _names_a_secret(k)), None)
            if secret is not None:
                raise ValueError(
                    f"provider.{secret}: secrets must not be written in a task file; set "
                    "ORGA_API_KEY (or OPENAI_API_KEY / ANTHROPIC_API_KEY / OPENROUTER_API_KEY) "
                    "in the environment of the workers"
                )
        return value


def _names_a_secret(name: str) -> bool:
    lowered = name.lower()
    return "key" in lowered or "token" in lowered


class CriticSpec(_Strict):
    """Who reviews a step's result before it completes: a registered agent, or a human.

    ``{agent: NAME, rubric, max_rounds}``: when the step's worker answers (and its
    ``done_when`` passed), a reasoning worker asks the agent's model to approve the result or
    ask for a revision, judging it by ``rubric``; ``{human: true, rubric, max_rounds}`` puts the
    same question on the review queue. A revision's reason goes back to the worker; a revision
    asked for beyond ``max_rounds`` escalates the step to a human with both sides' words.
    ``provider`` and ``system_prompt`` override the agent's (the intake fills them in from the
    registered profile; see :func:`shared.agent_profile.resolve_critics`).
    """

    agent: str | None = Field(default=None, pattern=AGENT_NAME_PATTERN)
    human: bool = False
    rubric: str = Field(min_length=1, max_length=20_000)
    max_rounds: int = Field(default=2, ge=0, le=50)
    """Revisions the critic may send back to the worker; the next one escalates instead."""
    provider: ProviderSpec | None = None
    system_prompt: str | None = None

    @model_validator(mode="after")
    def _one_reviewer(self) -> CriticSpec:
        if self.human and self.agent is not None:
            raise ValueError(
                f"a critic is an agent or a human, not both: remove `agent: {self.agent}` "
                "or `human: true`"
            )
        if not self.human and self.agent is None:
            raise ValueError(
                "a critic names its reviewer: `agent: NAME` (a registered agent) or `human: true`"
            )
        if self.human and (self.provider is not None or self.system_prompt is not None):
            raise ValueError(
                "a human critic has no `provider` or `system_prompt`; remove them, or name an "
                "`agent` instead of `human: true`"
            )
        return self

    @property
    def reviewer(self) -> str:
        """``agent:NAME`` or ``human``, as the journal and the review context name it."""
        return "human" if self.human else f"agent:{self.agent}"


StepSpec.model_rebuild()


class TaskLimits(_Strict):
    """Per-step loop limits; the defaults are Symbiont's."""

    max_iterations: int = Field(default=25, ge=1)
    max_total_tokens: int = Field(default=100_000, ge=1)
    step_timeout: Duration = timedelta(minutes=5)
    tool_timeout: Duration = timedelta(seconds=30)
    max_concurrent_tools: int = Field(default=5, ge=1)
    context_token_budget: int = Field(default=32_000, ge=256)
    temperature: float = Field(default=0.3, ge=0.0, le=2.0)
    max_output_tokens: int = Field(default=16_384, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0, le=1_000_000)
    """The most the whole task may spend on model calls (its critics and sub-agents
    included), in US dollars; a call whose worst case would pass it is not sent."""
    on_budget_exhausted: Literal["fail", "escalate"] = "fail"
    """When the money runs out: the task fails (``budget exhausted``, milestones kept), or
    its step goes to a human for review."""


class ReviewSpec(_Strict):
    """How long an escalation waits for a human, and what happens when nobody decides."""

    deadline: Duration = timedelta(hours=24)
    default_decision: Literal["retry", "skip", "abort"] = "abort"


class TaskSpec(_Strict):
    """A task: a goal, optional explicit steps, the model, tools, policy and limits."""

    goal: str = Field(min_length=1)
    agent: str | None = Field(default=None, pattern=AGENT_NAME_PATTERN)
    """A registered agent profile whose fields this task starts from (resolved at intake)."""
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    agent_id: str = Field(default="agent", min_length=1, max_length=128)
    system_prompt: str | None = None
    steps: list[StepSpec] = Field(default_factory=list)
    provider: Annotated[ProviderSpec, SharedWhenIdentical()] = Field(
        default_factory=shared_default(ProviderSpec)
    )
    tools: list[str] | None = None
    tool_profile: ToolProfile | None = None
    mcp_servers: list[McpServerSpec] = Field(default_factory=list)
    """MCP tool servers whose tools the agent may call as ``<server>__<tool>`` (shared.mcp)."""
    policy: Annotated[PolicySpec, SharedWhenIdentical()] = Field(
        default_factory=shared_default(PolicySpec)
    )
    step_iteration: Annotated[StepIterationConfig, SharedWhenIdentical()] = Field(
        default_factory=shared_default(StepIterationConfig)
    )
    pre_hydration: PreHydrationConfig | None = None
    knowledge: KnowledgeSpec | None = None
    stagnation: Annotated[StagnationConfig, SharedWhenIdentical()] = Field(
        default_factory=shared_default(StagnationConfig)
    )
    context: Annotated[ContextStrategy, SharedWhenIdentical()] = Field(
        default_factory=shared_default(SlidingWindow)
    )
    recovery: Annotated[RecoveryStrategy, SharedWhenIdentical()] = Field(
        default_factory=shared_default(Retry)
    )
    tool_recovery: dict[str, RecoveryStrategy] = Field(default_factory=dict)
    limits: Annotated[TaskLimits, SharedWhenIdentical()] = Field(
        default_factory=shared_default(TaskLimits)
    )
    review: Annotated[ReviewSpec, SharedWhenIdentical()] = Field(
        default_factory=shared_default(ReviewSpec)
    )
    workspace: str | None = None
    workspace_template: str | None = None
    tool_dispatch: Literal["auto", "queue", "inline"] = "auto"
    metadata: dict[str, str] = Field(default_factory=dict)
    delegated_workspace: WorkspaceMode = "subfolder"
    """When this task is a sub-agent's: work in a subfolder of the parent's workspace, or in
    a copy of it (usually set by the agent profile)."""
    delegation: ParentLink | None = None
    """Set by the runtime on a task created by a ``delegate`` call: the parent's call it
    answers (:mod:`shared.delegation`)."""

    @field_validator("steps")
    @classmethod
    def _unique_step_ids(cls, steps: list[StepSpec]) -> list[StepSpec]:
        seen: set[str] = set()
        for step in steps:
            if step.id in seen:
                raise ValueError(f"step id {step.id!r} is used twice; step ids must be unique")
            seen.add(step.id)
        return steps

    def unpriced(self) -> str | None:
        """Why the task's money limit cannot be enforced (a model with no known price: the
        task's own, or a critic's it names), None when it can or there is none."""
        if self.max_cost_usd is None:
            return None
        providers = [("provider", self.provider)] + [
            (f"steps.{i}.critic.provider", step.critic.provider)
            for i, step in enumerate(self.steps)
            if step.critic is not None and step.critic.provider is not None
        ]
        for where, provider in providers:
            if price_of(provider.model, provider.kind, provider.pricing) is None:
                return unpriced_message(provider.model, where)
        return None

    @property
    def max_cost_usd(self) -> float | None:
        """The task's money limit: its own ``limits.max_cost_usd``, capped by what its parent
        reserved for it (a sub-agent's ``delegation.max_cost_usd``)."""
        own = self.limits.max_cost_usd
        cap = self.delegation.max_cost_usd if self.delegation is not None else None
        if cap is None:
            return own
        return cap if own is None else min(own, cap)

    @field_validator("mcp_servers")
    @classmethod
    def _unique_mcp_servers(cls, servers: list[McpServerSpec]) -> list[McpServerSpec]:
        check_unique_names(servers, "mcp_servers")
        check_no_credentials(servers, "mcp_servers")
        return servers

    def loop_config(self, step: StepSpec | None = None) -> LoopConfig:
        """The loop configuration of one step."""
        limits = self.limits
        max_iterations = step.max_iterations if step and step.max_iterations else None
        link = self.delegation
        return LoopConfig(
            max_iterations=_capped(max_iterations or limits.max_iterations, link, "iterations"),
            max_total_tokens=_capped(limits.max_total_tokens, link, "tokens"),
            timeout=limits.step_timeout,
            default_recovery=self.recovery,
            tool_timeout=limits.tool_timeout,
            max_concurrent_tools=limits.max_concurrent_tools,
            context_token_budget=limits.context_token_budget,
            temperature=limits.temperature,
            max_output_tokens=limits.max_output_tokens,
            tool_profile=self.tool_profile,
            step_iteration=self.step_iteration,
            pre_hydration=self.pre_hydration,
            knowledge=self.knowledge,
            mcp_servers=list(self.mcp_servers) or None,
            delegation_depth=self.delegation.depth if self.delegation is not None else 0,
            max_cost_usd=self.max_cost_usd,
        )


def _capped(value: int, link: ParentLink | None, what: Literal["iterations", "tokens"]) -> int:
    """A sub-agent's limit, capped by what its parent's step had left for it."""
    if link is None:
        return value
    cap = link.max_iterations if what == "iterations" else link.max_total_tokens
    return value if cap is None else max(min(value, cap), 1)


def task_json_schema() -> dict[str, Any]:
    """The JSON Schema of a task file (``orga schema``): its defaults load back as written."""
    return TaskSpec.model_json_schema(schema_generator=DurationDefaultsSchema)


def parse_task(data: Any, source: str = "task") -> TaskSpec:
    """Validate a decoded task; raise TaskSpecError listing every field at fault.

    The task must be JSON data (what YAML adds, such as binary strings, dates, sets and
    non-string keys, is refused), at most ``MAX_TASK_DEPTH`` levels deep and ``MAX_TASK_VALUES``
    values large; unknown fields are refused at every level.
    """
    if not isinstance(data, dict):
        raise TaskSpecError(
            f"{source}: a task must be a mapping with at least 'goal', got {type(data).__name__}"
        )
    problem = _json_problem(data)
    if problem is not None:
        raise TaskSpecError(f"{source}: {problem}")
    try:
        spec = TaskSpec.model_validate(data, extra="forbid")
    except ValidationError as exc:
        raise TaskSpecError(f"{source}: {describe_validation_error(exc)}") from exc
    except (ArithmeticError, TypeError, LookupError) as exc:
        # A validator that failed outside pydantic's error types (a duration too large for a
        # timedelta raises OverflowError): still the task's fault, so name the section.
        raise TaskSpecError(
            f"{source}: {_failing_section(data)}: value out of range "
            f"({type(exc).__name__}: {exc}); use smaller numbers and durations"
        ) from exc
    unpriced = spec.unpriced()
    if unpriced is not None:
        raise TaskSpecError(f"{source}: {unpriced}")
    return spec


def check_task_id(task_id: str) -> str:
    """``task_id`` when it matches :data:`TASK_ID_PATTERN`; TaskSpecError naming it otherwise."""
    if TASK_ID_PATTERN.fullmatch(task_id):
        return task_id
    shown = repr(task_id[:64]) + (f"... ({len(task_id)} characters)" if len(task_id) > 64 else "")
    raise TaskSpecError(
        f"task id {shown} is not valid: use 1 to {MAX_TASK_ID_CHARS} letters, digits, '.', '_' "
        "or '-', starting with a letter or digit (no path separators, no '.' or '..'), or "
        "leave it out to get a generated one"
    )


def task_workspace(root: str, task_id: str) -> str:
    """The workspace folder of a task without an explicit one: ``{root}/{task_id}``, checked
    to be a folder strictly under ``root`` (a second line of defence behind :func:`check_task_id`).
    """
    base = Path(root).absolute()
    folder = base / check_task_id(task_id)
    if folder.parent != base or folder.name in ("", ".", ".."):
        raise TaskSpecError(
            f"task id {task_id!r} would put its workspace at {str(folder)!r}, outside "
            f"ORGA_WORKSPACE_ROOT {str(base)!r}; use a plain task id"
        )
    return f"{root}/{task_id}"


def parse_task_text(text: str, source: str = "task") -> TaskSpec:
    """Validate a task given as YAML or JSON text (what the intake stream carries)."""
    return parse_task(decode_task_text(text, source), source)


def decode_task_text(text: str | bytes, source: str = "task") -> Any:
    """The data of a task given as YAML or JSON text, not yet validated; too large or empty
    text is refused, and so are bytes that are not UTF-8 (:func:`as_task_text`)."""
    text = as_task_text(text, source)
    size = len(text.encode("utf-8"))
    if size > MAX_TASK_BYTES:
        raise TaskSpecError(
            f"{source}: the task is {size} bytes; the limit is {MAX_TASK_BYTES} bytes "
            "(put large inputs in the workspace and reference them by path)"
        )
    if not text.strip():
        raise TaskSpecError(f"{source}: the task is empty; it needs at least a 'goal'")
    return _decode(text, source)


def as_task_text(value: str | bytes, source: str = "task") -> str:
    """A task's text as UTF-8, or TaskSpecError naming the first byte that is not (its offset,
    its line, its value) and the fix: invalid bytes are refused, never replaced by U+FFFD.

    A ``str`` is checked too: one holding lone surrogates (bytes decoded with
    ``surrogateescape``, as ``sys.argv`` or a file name may carry them) is refused the same way.
    """
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TaskSpecError(_not_utf8(source, value, exc)) from None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "surrogateescape" if _escaped(value) else "surrogatepass")
        as_task_text(raw, source)  # raises, naming the byte
    return value


def _escaped(text: str) -> bool:
    """Whether every lone surrogate of ``text`` is a ``surrogateescape`` byte (U+DC80-U+DCFF)."""
    return all("\udc80" <= c <= "\udcff" for c in text if "\ud800" <= c <= "\udfff")


def _not_utf8(source: str, raw: bytes, exc: UnicodeDecodeError) -> str:
    line = raw.count(b"\n", 0, exc.start) + 1
    column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
    return (
        f"{source}: not valid UTF-8 at byte offset {exc.start} (line {line}, byte {column} of "
        f"the line: 0x{raw[exc.start]:02x}, {exc.reason}); invalid bytes are not replaced: "
        "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE`) or replace that byte"
    )


def load_task_file(path: str | Path) -> TaskSpec:
    """Read a YAML or JSON task file; a relative ``workspace`` is taken from the file's folder.
    A file that is not UTF-8 is refused with the offset of its first invalid byte."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise TaskSpecError(f"cannot read task file {str(file)!r}: {exc.strerror}") from exc
    data = _decode(as_task_text(raw, str(file)), str(file))
    spec = parse_task(data, str(file))
    resolved = _resolve_paths(spec, file.parent)
    _check_files(resolved, str(file))
    return resolved


def _check_files(spec: TaskSpec, source: str) -> None:
    """The files a task file names must exist when it is read (on the machine that reads it):
    a missing template or script is refused here, not found out by a worker later."""
    missing = []
    if spec.workspace_template is not None and not Path(spec.workspace_template).is_dir():
        missing.append(f"workspace_template: {spec.workspace_template!r} is not a folder")
    if spec.provider.script is not None and not Path(spec.provider.script).is_file():
        missing.append(f"provider.script: {spec.provider.script!r} is not a file")
    if missing:
        raise TaskSpecError(
            f"{source}: " + "; ".join(missing) + " (relative paths are taken from the task "
            "file's folder); fix the path or create it"
        )


def _resolve_paths(spec: TaskSpec, base: Path) -> TaskSpec:
    """Relative paths in a task file are relative to the file's folder."""

    def absolute(value: str | None) -> str | None:
        if value is None or Path(value).is_absolute():
            return value
        return str((base / value).resolve())

    provider = spec.provider.model_copy(update={"script": absolute(spec.provider.script)})
    files = [absolute(f) or f for f in spec.policy.policy_files]
    policy = spec.policy.model_copy(update={"policy_files": files}) if files else spec.policy
    steps = [_critic_paths(step, absolute) for step in spec.steps]
    return spec.model_copy(
        update={
            "workspace": absolute(spec.workspace),
            "workspace_template": absolute(spec.workspace_template),
            "provider": provider,
            "policy": policy,
            "steps": steps,
        }
    )


def _critic_paths(step: StepSpec, absolute: Callable[[str | None], str | None]) -> StepSpec:
    """A step whose critic overrides the provider's script: the script taken from the file's
    folder too."""
    critic = step.critic
    if critic is None or critic.provider is None or critic.provider.script is None:
        return step
    provider = critic.provider.model_copy(update={"script": absolute(critic.provider.script)})
    return step.model_copy(update={"critic": critic.model_copy(update={"provider": provider})})


def _decode(text: str, source: str) -> Any:
    try:
        if source.endswith(".json") or text.lstrip()[:1] in ("{", "["):
            try:
                return json.loads(text)
            except ValueError:
                if source.endswith(".json"):
                    raise
        return yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise TaskSpecError(f"{source}: not valid YAML or JSON: {exc}") from exc
    except (AttributeError, TypeError, LookupError, ArithmeticError) as exc:
        # PyYAML's constructors fail this way on some malformed tagged scalars
        # (``!!timestamp x`` raises AttributeError).
        raise TaskSpecError(
            f"{source}: not valid YAML or JSON: a tagged value cannot be read "
            f"({type(exc).__name__}: {exc}); remove the '!!' tag or fix the value"
        ) from exc
    except RecursionError as exc:
        raise TaskSpecError(
            f"{source}: not valid YAML or JSON: nested too deeply to parse; a task is at most "
            f"{MAX_TASK_DEPTH} levels deep"
        ) from exc


_JSON_SCALARS = (str, int, float, bool, type(None))


def _json_problem(data: dict[str, Any]) -> str | None:
    """Why ``data`` is not plain JSON data of a sensible size, or None."""
    for count, (path, value, depth) in enumerate(_walk(data), start=1):
        if count > MAX_TASK_VALUES:
            return (
                f"the task holds more than {MAX_TASK_VALUES} values (YAML aliases count each "
                "time they are used); make it smaller"
            )
        problem = _value_problem(value, depth)
        if problem is not None:
            return f"{_location(path)}: {problem}"
    return None


def _walk(data: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], Any, int]]:
    """``(path, value, depth)`` of every value, depth first. A mapping key that is not a string
    comes as a value of its own, wrapped in ``_Key``. Containers at the depth limit are not
    entered."""
    stack: list[tuple[tuple[Any, ...], Any, int]] = [((), data, 0)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if depth >= MAX_TASK_DEPTH:
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    yield (*path, key), _Key(key), depth + 1
                stack.append(((*path, key), item, depth + 1))
        elif isinstance(value, list):
            stack.extend(((*path, index), item, depth + 1) for index, item in enumerate(value))


class _Key:
    """A mapping key that is not a string (YAML allows ``1:``, ``null:`` and ``on:``)."""

    def __init__(self, key: Any) -> None:
        self.key = key


def _value_problem(value: Any, depth: int) -> str | None:
    if isinstance(value, _Key):
        return (
            f"the key {_short(value.key)} is not a string ({type(value.key).__name__}); "
            "keys must be strings (quote it)"
        )
    if isinstance(value, dict | list):
        if depth >= MAX_TASK_DEPTH:
            return f"nested more than {MAX_TASK_DEPTH} levels deep; flatten the data"
        return None
    return _scalar_problem(value)


def _scalar_problem(value: Any) -> str | None:
    if not isinstance(value, _JSON_SCALARS):
        return (
            f"a {type(value).__name__} value ({_short(value)}) is not JSON data; a task holds "
            "only strings, numbers, booleans, null, lists and mappings (quote dates and such)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a JSON number; give a finite number"
    if isinstance(value, str) and not _is_utf8(value):
        return f"the text {_short(value)} contains an unpaired surrogate, which is not UTF-8"
    return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _location(path: tuple[Any, ...]) -> str:
    """``provider.replies.0.text``; a key that is empty or has dots or spaces is quoted."""
    return ".".join(_location_part(part) for part in path) or "<root>"


def _location_part(part: Any) -> str:
    if isinstance(part, str) and (not part or "." in part or part.strip() != part):
        return repr(part)
    return str(part)


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _failing_section(data: dict[str, Any]) -> str:
    """The first top-level field that fails to validate on its own, or ``<root>``."""
    for key, value in data.items():
        try:
            TaskSpec.model_validate({"goal": "locate", key: value}, extra="forbid")
        except ValidationError:
            continue
        except (ArithmeticError, TypeError, LookupError):
            return str(key)
    return "<root>"


def describe_validation_error(exc: ValidationError, limit: int = 8) -> str:
    """One line per error: ``field.path: message (got value)``."""
    parts = []
    for error in exc.errors()[:limit]:
        location = _location(tuple(error["loc"]))
        got = error.get("input")
        shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
        if len(shown) > 80:
            shown = shown[:77] + "..."
        parts.append(f"{location}: {error['msg']} (got {shown})")
    if exc.error_count() > limit:
        parts.append(f"... and {exc.error_count() - limit} more")
    return "; ".join(parts)
