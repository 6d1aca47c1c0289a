"""The wire contract between the coordinator and the workers (see ``docs/protocol.md``).

Every dispatch carries a :class:`Fence` (task, step, iteration, attempt). Workers echo it in the
observation they publish on the observations stream; the coordinator applies an observation only
when its fence is the one it is waiting for, so duplicates and stale redeliveries are ignored.

Stream entries are flat: ``{"v": "1", "kind": <kind>, "body": <JSON>}``. ``decode_entry`` turns
an entry into a model or raises :class:`~shared.errors.WireFormatError` saying what is wrong.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.actions import GateModification, Observation, ProposedAction, ToolCallAction
from shared.approval import HeldCall
from shared.conversation import Conversation, ConversationMessage, SharedMessage
from shared.errors import WireFormatError
from shared.events import RecoveryTriggered
from shared.identical import SharedWhenIdentical
from shared.inference import ModelCall, ProviderWait, Usage
from shared.loop_types import LoopConfig, RecoveryStrategy, Retry, TerminationReason
from shared.policy import PolicySpec
from shared.task_spec import ProviderSpec

__all__ = [
    "PROTOCOL_VERSION",
    "ActMode",
    "AnyMessage",
    "ChildFinishedMessage",
    "CompleteReasoning",
    "ConversationRef",
    "ErrorKind",
    "Fence",
    "ReasonRequest",
    "ReasonedMessage",
    "RunEach",
    "StreamMessage",
    "ToolAnswer",
    "ToolObservedMessage",
    "ToolRequest",
    "WorkerFailedMessage",
    "decode_entry",
    "encode_entry",
]

PROTOCOL_VERSION = "4"

ErrorKind = Literal["config", "transient", "internal", "provider_unavailable", "policy_unavailable"]
"""What a worker failure is, so that the coordinator never matches strings:

- ``config``: the deployment or the task is wrong (a missing script file or template, a missing
  or rejected API key, a refused ``base_url``, an unknown model); trying again cannot help, so
  the task fails at once with the worker's message;
- ``provider_unavailable``: the model's provider kept failing (429, 5xx, unreachable, timeouts)
  through the worker's retries (``ORGA_PROVIDER_RETRY_DEADLINE_S``): an outage, not the task's
  fault; the coordinator holds the dispatch and sends it again with back-off, using up no
  attempt, until ``ORGA_OUTAGE_DEADLINE_S``, then fails the task naming the outage;
- ``policy_unavailable``: the policy engine (an OPA server) could not be asked; the same;
- ``transient``: a timeout or a network failure outside the provider's retries; the dispatch
  may be tried again (as ``internal``);
- ``internal``: anything else (a bug, a crash in the library); retried, then dead-lettered.
"""


_Config = Annotated[LoopConfig, SharedWhenIdentical()]
_Provider = Annotated[ProviderSpec, SharedWhenIdentical()]
_Policy = Annotated[PolicySpec, SharedWhenIdentical()]
_Recovery = Annotated[RecoveryStrategy, SharedWhenIdentical()]
"""A request's settings, the same in every request of a task (and often of every task): each
distinct value parsed once per process and shared (:mod:`shared.identical`)."""


class Fence(BaseModel):
    """Identifies one dispatch: only the observation carrying the awaited fence is applied."""

    model_config = ConfigDict(frozen=True)

    task_id: str = Field(min_length=1)
    step_id: str = Field(min_length=1)
    iteration: int = Field(ge=0)
    attempt: int = Field(ge=0)
    call_id: str | None = None
    nonce: str = Field(default="", max_length=64)
    """Random per dispatch: a fence re-issued after Redis lost its last second of writes (and
    the dispatch counter with it) still differs from the one it replaces."""

    def token(self) -> str:
        """A compact, printable form: ``task/step/iteration/attempt[/call]``."""
        base = f"{self.task_id}/{self.step_id}/{self.iteration}/{self.attempt}"
        return f"{base}/{self.call_id}" if self.call_id else base

    def liveness_id(self) -> str:
        """The member of ``orga:heartbeats`` that says whether this dispatch runs: unique per
        dispatch (the nonce) and per call, the same for a Celery redelivery of it."""
        return f"{self.task_id}|{self.nonce}|{self.iteration}|{self.call_id or '-'}"

    def call_key(self) -> str:
        """What stays the same for every delivery of this fence's call, re-dispatches (a new
        attempt and nonce) included: ``task/step/iteration/call``."""
        return f"{self.task_id}/{self.step_id}/{self.iteration}/{self.call_id or '-'}"

    def for_call(self, call_id: str) -> Fence:
        """The fence of one tool call of this iteration."""
        return self.model_copy(update={"call_id": call_id})

    def acting(self) -> Fence:
        """For a reasoning dispatch's fence: the fence its chained tool calls carry (with their
        call ids), numbered like the iteration the reasoning opens."""
        return self.model_copy(update={"iteration": self.iteration + 1, "call_id": None})


class ConversationRef(BaseModel):
    """Where a worker reads the conversation of a reasoning request: the first ``length``
    messages of ``orga:conversation:{task_id}``, as of the coordinator's ``epoch`` (bumped
    whenever a compaction rewrote it, so a worker's cached prefix of an older epoch is not
    reused)."""

    model_config = ConfigDict(frozen=True)

    length: int = Field(ge=0)
    epoch: int = Field(default=0, ge=0)
    created_at: float = 0.0
    """When the task was created: a task id reused after a purge is another conversation."""
    tail: list[SharedMessage] = Field(default_factory=list)
    """The last ``len(tail)`` of the ``length`` messages, carried in the request (the
    coordinator's builder sends what was appended since the task's previous reasoning turn,
    when it is small): a worker that read the task up to where the tail starts reads nothing
    from Redis, one that did not reads only the messages before it. Empty: read all it lacks.
    An older worker ignores it and reads as before."""

    @property
    def tail_start(self) -> int:
        """Where the tail starts among the ``length`` messages."""
        return self.length - len(self.tail)


class ActMode(StrEnum):
    """Who runs the approved calls of a reasoning request's iteration: the one field that
    chooses Act's transport (every mode runs each call as a :class:`ToolRequest` through the
    same ``run_tool_call``)."""

    COORDINATOR = "coordinator"
    """The reasoning worker answers; the coordinator dispatches each approved call."""
    CHAIN = "chain"
    """The reasoning worker sends the approved calls (up to ``config.max_concurrent_tools``)
    straight to the tool workers, each under ``fence.acting().for_call(call_id)``
    (:meth:`ReasonRequest.tool_request`), in the same Redis transaction as the ``reasoned``
    message that lists them in ``chained``: the coordinator is then not between Gate and Act,
    and dispatches the rest, if any, as results come in. A lone approved call carries the
    ``reasoned`` message instead (:class:`CompleteReasoning`)."""
    INLINE = "inline"
    """The reasoning worker runs the approved calls itself (``tool_dispatch: inline``) and
    returns their outcomes in ``ReasonedMessage.acted``: the iteration costs one dispatch."""
    AUTO = "auto"
    """As :attr:`INLINE` when every approved call is of a read-only tool of the worker's
    registry (``file_read``, ``file_list``, ``recall_knowledge``: bounded reads that run no
    code and write nothing), else as :attr:`CHAIN` (``tool_dispatch: auto``, the default)."""


class ReasonRequest(BaseModel):
    """What a reasoning worker needs to run Reason and Gate for one iteration.

    The coordinator has already fitted ``conversation`` to the context budget; ``purpose`` is
    ``plan`` when the model is asked to break the goal into steps, ``critic`` when a step's
    critic model is asked for its verdict (no tools are offered for either).
    """

    model_config = ConfigDict(frozen=True)

    fence: Fence
    purpose: Literal["act", "plan", "critic"] = "act"
    agent_id: str
    conversation: Conversation = Field(default_factory=Conversation)
    conversation_ref: ConversationRef | None = None
    """Set by the coordinators: the conversation is not in the request but in Redis, and the
    worker reads what it lacks (the request stays the same size however long the task runs)."""
    config: _Config
    provider: _Provider = Field(default_factory=ProviderSpec)
    policy: _Policy = Field(default_factory=PolicySpec)
    workspace: str
    usage: Usage = Field(default_factory=Usage)
    allowed_tools: list[str] | None = None
    model_calls: int = Field(default=0, ge=0)
    workspace_template: str | None = None
    workspace_base: str | None = None
    """Set for a sub-agent that works in a subfolder of its parent's workspace: the workspace of
    its delegation tree's root. Every folder from there down to ``workspace`` must be a real
    directory (no link) that the runtime created itself; a worker checks that each time it
    opens the workspace (:mod:`workers.workspaces`)."""
    recovery: _Recovery = Field(default_factory=Retry)
    tool_recovery: dict[str, RecoveryStrategy] = Field(default_factory=dict)
    trace_parent: str | None = None
    """The W3C ``traceparent`` of the coordinator's span that sent this dispatch."""
    act: ActMode = ActMode.COORDINATOR
    """Who runs the calls this iteration's Gate approves (:class:`ActMode`)."""
    look_at: float | None = None
    """When the coordinator first looks at this dispatch (wall-clock seconds), as it set it at
    the dispatch; None: not said. A worker that starts it well before then, and no more than
    one heartbeat timeout before, leaves its task's look alone (:mod:`workers.liveness`)."""

    def tool_request(self, call: ToolCallAction) -> ToolRequest:
        """The request that runs one approved call of this iteration on a tool worker (built
        without validation: every value comes from this validated request and the gated
        call, of its field's type; the fields not given take their defaults, ``answer``'s
        given: pydantic's ``model_construct`` inspects a default factory's signature each time
        it calls one)."""
        return ToolRequest.model_construct(
            answer=RunEach(),
            fence=self.fence.acting().for_call(call.call_id),
            purpose="act",
            agent_id=self.agent_id,
            action=call,
            workspace=self.workspace,
            workspace_template=self.workspace_template,
            workspace_base=self.workspace_base,
            config=self.config,
            recovery=self.tool_recovery.get(call.name, self.recovery),
            policy=self.policy,
            allowed_tools=self.allowed_tools,
            trace_parent=self.trace_parent,
        )


class RunEach(BaseModel):
    """Run the request's call, and ``also`` concurrently (pre-hydration sends all of a task's
    resolutions in one dispatch); each answers with its own ``tool_observed`` message."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["each"] = "each"
    also: list[ToolCallAction] = Field(default_factory=list)


class CompleteReasoning(BaseModel):
    """The only approved call of a chained iteration (:attr:`ActMode.CHAIN`): the tool worker
    answers with ``reasoned``, its ``acted`` filled in, instead of a ``tool_observed`` message,
    so the iteration costs the coordinator one observation."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["completes"] = "completes"
    reasoned: ReasonedMessage


ToolAnswer = Annotated[RunEach | CompleteReasoning, Field(discriminator="kind")]


class ToolRequest(BaseModel):
    """What a tool worker needs to run one tool call.

    ``purpose`` says what the call is for (``act``, ``prehydrate``, ``verify``) and ``answer``
    how it is run and answered.
    """

    model_config = ConfigDict(frozen=True)

    fence: Fence
    purpose: Literal["act", "prehydrate", "verify"] = "act"
    agent_id: str
    action: ToolCallAction
    workspace: str
    workspace_template: str | None = None
    workspace_base: str | None = None
    """Set for a sub-agent that works in a subfolder of its parent's workspace: the workspace of
    its delegation tree's root. Every folder from there down to ``workspace`` must be a real
    directory (no link) that the runtime created itself; a worker checks that each time it
    opens the workspace (:mod:`workers.workspaces`)."""
    config: _Config
    recovery: _Recovery = Field(default_factory=Retry)
    policy: _Policy = Field(default_factory=PolicySpec)
    allowed_tools: list[str] | None = None
    trace_parent: str | None = None
    """The W3C ``traceparent`` of the span that sent this call (a coordinator's, or the
    reasoning worker's that chained it)."""
    answer: ToolAnswer = Field(default_factory=RunEach)
    """How the tool worker runs and answers this request (:class:`RunEach` or
    :class:`CompleteReasoning`): the one field that chooses the tool side's transport."""
    edited_by: str | None = None
    """A held call a reviewer edited (:mod:`shared.approval`): who. Its new arguments pass the
    gate's deny rules in the tool worker (the reviewer's approval stands for any ``Ask``)."""

    @property
    def gated(self) -> bool:
        """Pre-hydration resolutions and edited held calls pass the schema check and the gate
        in the tool worker; other ``act`` calls were gated by the reasoning worker; ``verify``
        calls are the task's own ``done_when`` checks."""
        return self.purpose == "prehydrate" or self.edited_by is not None

    @property
    def completes(self) -> ReasonedMessage | None:
        """The reasoning this lone chained call answers for, if it is one."""
        return self.answer.reasoned if isinstance(self.answer, CompleteReasoning) else None

    @property
    def also(self) -> list[ToolCallAction]:
        """The calls run with this one, concurrently (a pre-hydration batch)."""
        return self.answer.also if isinstance(self.answer, RunEach) else []


class ToolObservedMessage(BaseModel):
    """A tool worker ran one tool call."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["tool_observed"] = "tool_observed"
    fence: Fence
    observation: Observation
    recovery_events: list[RecoveryTriggered] = Field(default_factory=list)
    escalation_reason: str | None = None
    duration_ms: float = 0.0
    modification: GateModification | None = None
    """The gate's Modify when the tool worker gated the call itself (a pre-hydration
    resolution), before and after (journaled as ``GateModified``; optional, so older workers
    and coordinators still agree)."""


class ReasonedMessage(BaseModel):
    """A reasoning worker ran Reason and Gate for one iteration.

    ``new_messages`` are appended to the conversation in order (the assistant turn, then the
    feedback for denied actions). ``approved_calls`` are the tool calls to run next;
    ``terminal_output`` is set when the model gave its answer; ``termination`` when the
    iteration ended the loop (inference failed, refusal, limits). ``acted`` holds the tool
    outcomes when the request asked the reasoning worker to run the approved calls itself
    (:attr:`ActMode.INLINE`, or :attr:`ActMode.AUTO` for read-only calls): the whole iteration
    then costs one dispatch. ``chained`` lists the calls the reasoning worker sent to the tool
    workers itself (:attr:`ActMode.CHAIN`, or :attr:`ActMode.AUTO` for the others).
    ``held_calls`` are the calls the gate asked a human about (:mod:`shared.approval`): not
    run, neither approved nor denied; the coordinator opens a review for each.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["reasoned"] = "reasoned"
    fence: Fence
    new_messages: list[ConversationMessage] = Field(default_factory=list)
    actions: list[ProposedAction] = Field(default_factory=list)
    approved_calls: list[ToolCallAction] = Field(default_factory=list)
    held_calls: list[HeldCall] = Field(default_factory=list)
    denied_count: int = 0
    usage: Usage = Field(default_factory=Usage)
    terminal_output: str | None = None
    termination: TerminationReason | None = None
    acted: list[ToolObservedMessage] | None = None
    chained: list[str] = Field(default_factory=list)
    duration_ms: float = 0.0
    """Reason and Gate (the model call with its retries); the calls run in ``acted`` carry
    their own."""
    provider_waits: list[ProviderWait] = Field(default_factory=list)
    """Transient provider errors and shared rate-limit holds the model call waited out (the
    coordinator journals them; they are not failed attempts)."""
    modifications: list[GateModification] = Field(default_factory=list)
    """The gate's Modify decisions of this iteration, before and after (journaled as
    ``GateModified``; optional, so older workers and coordinators still agree)."""
    model_call: ModelCall | None = None
    """The model call this iteration made (None: none was sent, e.g. over budget)."""


class WorkerFailedMessage(BaseModel):
    """A worker could not process a dispatch (bad payload, crash in the library)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["worker_failed"] = "worker_failed"
    fence: Fence
    error: str
    retryable: bool = True
    error_kind: ErrorKind = "internal"
    """What the failure is (:data:`ErrorKind`); a ``config`` failure fails the task at once."""
    service: str | None = None
    """The service that is down, for ``provider_unavailable`` and ``policy_unavailable``
    (``openai``, ``opa at http://opa:8181``)."""


class ChildFinishedMessage(BaseModel):
    """A sub-agent's task ended (or could not be created): the result of the parent's
    ``delegate`` call. Written by the coordinator that committed the child's end (in the same
    atomic commit), or by the intake that rejected the child.

    ``fence`` is the parent's fence for the call (``call_id``: the delegate call). The parent
    applies it when it waits on that call of that step and iteration and recorded
    ``child_task_id`` for it, whatever re-sends changed its awaited attempt since: the result
    of a call is applied once (a second copy finds the call answered)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["child_finished"] = "child_finished"
    fence: Fence
    child_task_id: str
    status: Literal["completed", "failed", "aborted", "rejected"]
    observation: Observation
    usage: Usage = Field(default_factory=Usage)
    iterations: int = Field(default=0, ge=0)
    milestones: list[str] = Field(default_factory=list)


AnyMessage = ReasonedMessage | ToolObservedMessage | WorkerFailedMessage | ChildFinishedMessage

StreamMessage = Annotated[AnyMessage, Field(discriminator="kind")]


_MESSAGE_ADAPTER: TypeAdapter[AnyMessage] = TypeAdapter(StreamMessage)


def encode_entry(message: AnyMessage) -> dict[str, str]:
    """The flat stream fields for ``message``."""
    return {"v": PROTOCOL_VERSION, "kind": message.kind, "body": message.model_dump_json()}


def decode_entry(fields: dict[Any, Any]) -> AnyMessage:
    """Parse stream fields; raise WireFormatError naming the version, kind or field at fault."""
    text = {_text(k): _text(v) for k, v in fields.items()}
    version = text.get("v")
    if version != PROTOCOL_VERSION:
        raise WireFormatError(
            f"unsupported protocol version {version!r} (this coordinator speaks "
            f"{PROTOCOL_VERSION!r}); upgrade the worker or the coordinator so they match"
        )
    if "body" not in text:
        raise WireFormatError(f"stream entry has no 'body' field; fields: {sorted(text)}")
    try:
        return _MESSAGE_ADAPTER.validate_json(text["body"])
    except ValidationError as exc:
        raise WireFormatError(f"invalid {text.get('kind')!r} message: {_summary(exc)}") from exc


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _summary(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        location = ".".join(str(p) for p in error["loc"]) or "<root>"
        parts.append(f"{location}: {error['msg']}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


CompleteReasoning.model_rebuild()
ToolRequest.model_rebuild()
