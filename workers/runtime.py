"""One worker process's services: its event loop, Redis client, tools, executor and models.

Built once per process (after Celery forks it, or when the worker's pool starts) from the
settings read at the process edge. The library is async: each process runs one event loop
(uvloop's, where it is installed) in a thread of its own. A reasoning worker's pool
(:class:`workers.pool.LoopPool`) runs each Celery task as an asyncio task on that loop; in
other pools (prefork, threads, solo) a task hands its coroutine to the loop and waits
(:meth:`ProcessServices.run`). A reasoning worker thus holds 200 model calls in flight on one
loop, over one aiohttp session (``workers/http_pool.py``); the Redis client, the shared
circuit breakers, the result cache and the heartbeats of running calls live on that loop too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from shared import keys
from shared.aio import cancel_and_wait, new_event_loop
from shared.conventions import InMemoryKnowledgeStore, KnowledgeSpec, KnowledgeStore
from shared.conversation import Conversation, ConversationMessage, shared_message
from shared.errors import ConfigError, OrgaError
from shared.inference import ToolDefinition
from shared.loop_types import LoopConfig
from shared.mcp import (
    McpListing,
    McpListRequest,
    McpServerSpec,
    combined_servers,
    parse_mcp_servers,
)
from shared.outbox import tool_entry
from shared.policy import PolicySpec
from shared.protocol import (
    ConversationRef,
    Fence,
    ReasonedMessage,
    ReasonRequest,
    ToolObservedMessage,
    ToolRequest,
    WorkerFailedMessage,
    encode_entry,
)
from shared.redaction import Redactor, redact_url, secret_values
from shared.settings import OrgaSettings
from shared.task_spec import ProviderSpec
from workers.applied_calls import RedisAppliedCalls
from workers.circuit_breaker import (
    CircuitBreakerRegistry,
    InMemoryBreakerStore,
    RedisBreakerStore,
)
from workers.executor import ToolExecutor
from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.factory import build_gate
from workers.gates.server_start import refused_server_start
from workers.http_pool import pooled_session
from workers.knowledge import RedisKnowledgeStore, knowledge_tools
from workers.liveness import Liveness
from workers.providers.base import BaseUrlError, InferenceProvider
from workers.providers.factory import build_provider
from workers.providers.rate_limit import (
    HoldReads,
    NoThrottle,
    ProviderThrottle,
    RedisThrottle,
    key_digest,
    read_ahead,
)
from workers.providers.scripted import Script, ScriptedProvider, load_script, parse_script
from workers.providers.settings import PROVIDER_DEFAULTS, ProviderKind, ProviderSettings
from workers.recovery import DeadLetterRecord, RecoveryLedger
from workers.redis_batch import CoalescedPipeline, OwnPipeline, SharedZadd
from workers.redis_driver import DRIVER_INFO
from workers.result_cache import InMemoryResultCache, RedisResultCache
from workers.tools.base import Tool, ToolContext, reads_only, starts_processes
from workers.tools.command import CommandEnvironment, CommandLimits, RunCommandTool
from workers.tools.errors import WorkspacePathError
from workers.tools.mcp import McpSessions, McpToolLookup
from workers.tools.registry import ToolRegistry, default_registry
from workers.workspaces import (
    InMemoryWorkspaceClaims,
    RedisWorkspaceClaims,
    WorkspaceClaims,
    open_subagent_workspace,
    open_task_workspace,
)

__all__ = [
    "LEDGERS_KEPT",
    "ProcessServices",
    "RedisDeadLetterSink",
    "WorkerCore",
    "local_core",
    "with_knowledge",
]

LEDGERS_KEPT = 1024
CONVERSATIONS_KEPT = 512
"""How many tasks' conversations a worker process keeps, to read only what it lacks."""
SCRIPTS_KEPT = 64
"""How many tasks' LlmRecovery counts a worker process remembers."""

log = logging.getLogger("orga.worker.runtime")

_T = TypeVar("_T")


class StaleConversationError(OrgaError):
    """A request's stored conversation was rewritten since it was sent (a stale dispatch)."""


class RedisDeadLetterSink:
    """Dead-lettered tool calls, on the ``orga:dead_letter`` stream for operators."""

    def __init__(self, redis: Redis, partitions: int = 1) -> None:
        self._redis = redis
        self._partitions = partitions

    async def put(self, record: DeadLetterRecord) -> None:
        """Append one record (on its task's partition's stream)."""
        await self._redis.xadd(
            keys.dead_letter_stream(keys.partition_of(record.task_id or "", self._partitions)),
            {"kind": "tool_call", "record": record.model_dump_json()},
            maxlen=keys.dead_letter_maxlen,
            approximate=True,
        )


class WorkerCore:
    """Implements :class:`workers.handlers.WorkerServices`: models, tools, gates, the executor.

    No Redis and no thread of its own: :class:`ProcessServices` adds those for a worker
    process, and the in-process driver (:mod:`orga.inprocess`) uses a core with
    in-memory breakers, cache and knowledge (:func:`local_core`).
    """

    def __init__(
        self,
        settings: OrgaSettings,
        provider_settings: ProviderSettings,
        executor: ToolExecutor,
        registry: ToolRegistry,
        knowledge: KnowledgeStore,
    ) -> None:
        self.settings = settings
        self.provider_settings = provider_settings
        self.registry = registry
        self.executor = executor
        self._knowledge = knowledge
        self._seeded: dict[tuple[str, bytes], None] = {}
        self._http: tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession] | None = None
        self._gates: dict[str, ReasoningPolicyGate] = {}
        self._ledgers: dict[str, RecoveryLedger] = {}
        self._scripts: dict[bytes, Script] = {}
        self._providers: dict[tuple[str | None, ...], InferenceProvider] = {}
        self._workspace_claims: WorkspaceClaims = InMemoryWorkspaceClaims()
        self._redactor = Redactor(secret_values(settings, provider_settings))
        self.mcp_deployment_servers = deployment_mcp_servers(settings)
        self.mcp = McpSessions(
            _command_environment(registry),
            idle_timeout_s=settings.mcp_idle_timeout_s,
            start_timeout_s=settings.mcp_list_timeout_s,
            limits=_command_limits(registry),
            allow_private_network=settings.allow_private_network,
            trusted=self.mcp_deployment_servers,
        )
        """This process's MCP connections (tool workers start servers; reasoning workers ask
        them for listings)."""
        self._mcp_listings: dict[str, McpListing] = {}
        executor.tools = McpToolLookup(executor.tools, self.mcp)

    async def aclose(self) -> None:
        """Close the MCP connections and the HTTP clients."""
        await self.mcp.aclose()
        self._providers.clear()
        if self._http is not None:
            _, session = self._http
            self._http = None
            await session.close()

    def http_session(self) -> aiohttp.ClientSession:
        """The process's one HTTP session for every model call (built on first use, on the
        running loop: call it from a coroutine), keeping up to ``ORGA_HTTP_MAX_CONNECTIONS``
        connections to each model endpoint. The providers ask for it at each call: a core
        used on another loop since (the in-process driver run twice with ``asyncio.run``)
        gets a new session."""
        loop = asyncio.get_running_loop()
        if self._http is not None:
            if self._http[0] is loop:
                return self._http[1]
            self._http[1].detach()  # its loop is gone: nothing to close on it
        session = pooled_session(self.settings.http_max_connections)
        self._http = (loop, session)
        return session

    # -- WorkerServices -------------------------------------------------------------------

    def provider(self, request: ReasonRequest) -> InferenceProvider:
        """The model the task asks for; a scripted model resumes where the task left off."""
        spec = request.provider
        if spec.replies is not None:
            provider: InferenceProvider = ScriptedProvider(self._script(spec.replies))
        else:
            settings = self._provider_settings(spec)
            path = settings.script_path
            if settings.provider is ProviderKind.SCRIPTED and path is not None:
                provider = ScriptedProvider(
                    self._script_file(path), on_exhausted=settings.script_on_exhausted
                )
            else:
                provider = self._http_provider(spec, settings)
        if isinstance(provider, ScriptedProvider):
            provider.seek(request.model_calls)
        return provider

    def _http_provider(self, spec: ProviderSpec, settings: ProviderSettings) -> InferenceProvider:
        """The provider of a model behind HTTP, built once per task choice (kind, model, base
        URL) in this process: it holds no state of a call (the pooled session, the throttle)."""
        key = (spec.kind, spec.model, spec.base_url, spec.script)
        provider = self._providers.get(key)
        if provider is None:
            base_url = settings.resolved_base_url() or ""
            provider = self._build(settings, self._throttle(settings, base_url))
            self._providers[key] = provider
            while len(self._providers) > SCRIPTS_KEPT:
                self._providers.pop(next(iter(self._providers)))
        return provider

    def _throttle(self, settings: ProviderSettings, base_url: str) -> ProviderThrottle:
        key = settings.resolved_api_key()
        digest = key_digest(base_url, key.get_secret_value() if key is not None else "")
        return self.throttle(settings.provider.value, digest)

    def throttle(self, provider: str, digest: str) -> ProviderThrottle:
        """The rate limit shared by every caller of one provider and key (``digest``, a hash
        of the base URL and key): none in a core of its own; a worker process shares one
        through Redis (:class:`ProcessServices`)."""
        return NoThrottle()

    def _script(self, replies: list[Any]) -> Script:
        """The task's scripted replies, validated once per process: every reasoning request
        of the task carries the whole script, and a fresh provider seeks into it."""
        key = hashlib.blake2b(json.dumps(replies).encode(), digest_size=16).digest()
        return self._kept_script(key, lambda: parse_script(replies, source="provider.replies"))

    def _script_file(self, path: Path) -> Script:
        """A script file, parsed again only when its size or modification time changes."""
        try:
            stat = path.stat()
        except OSError:
            return load_script(path)  # raises the ScriptError that names the file
        key = hashlib.blake2b(
            f"{path.resolve()}\0{stat.st_mtime_ns}\0{stat.st_size}".encode(), digest_size=16
        ).digest()
        return self._kept_script(key, lambda: load_script(path))

    def _kept_script(self, key: bytes, parse: Callable[[], Script]) -> Script:
        """The script kept under ``key``, else ``parse()``'s (the last SCRIPTS_KEPT are kept)."""
        script = self._scripts.pop(key, None) or parse()
        self._scripts[key] = script
        while len(self._scripts) > SCRIPTS_KEPT:
            self._scripts.pop(next(iter(self._scripts)))
        return script

    def _build(self, settings: ProviderSettings, throttle: ProviderThrottle) -> InferenceProvider:
        """The provider, on the process's session; a task that switched provider without a
        key bound to it is told so."""
        try:
            return build_provider(settings, session=self.http_session, throttle=throttle)
        except BaseUrlError:
            raise  # the URL is wrong, whichever key
        except ConfigError as exc:
            deployment = self.provider_settings
            defaults = PROVIDER_DEFAULTS.get(settings.provider)
            if settings.provider is deployment.provider or defaults is None:
                raise
            raise ConfigError(
                f"the task switches provider.kind to {settings.provider.value!r}, but this "
                f"worker's ORGA_API_KEY is bound to ORGA_PROVIDER={deployment.provider.value} "
                f"and no {defaults.api_key_env} is set; set {defaults.api_key_env} on the "
                f"workers to let tasks use {settings.provider.value}, or remove provider.kind "
                "from the task"
            ) from exc

    def _provider_settings(self, spec: ProviderSpec) -> ProviderSettings:
        """The process's provider settings with the task's choices on top (keys stay env-only).

        A key is bound to its provider and base URL: ``ORGA_API_KEY`` and ``ORGA_BASE_URL`` to
        ``ORGA_PROVIDER``; ``OPENAI_API_KEY`` / ``OPENROUTER_API_KEY`` / ``ANTHROPIC_API_KEY``
        to their provider. A task naming another ``provider.kind`` gets that provider's own
        key (if set) at that provider's default URL, never ``ORGA_API_KEY``. A task may not
        send a key to a base URL of its own choosing unless ``ORGA_ALLOW_TASK_BASE_URL`` is set.
        """
        deployment = self.provider_settings
        switched = spec.kind is not None and ProviderKind(spec.kind) is not deployment.provider
        configured = None if switched else deployment.base_url
        own_url = spec.base_url and spec.base_url.rstrip("/") != (configured or "").rstrip("/")
        if own_url and not self.settings.allow_task_base_url:
            asked = redact_url(spec.base_url or "")  # its credentials never shown
            raise ConfigError(
                f"the task asks for provider.base_url {asked!r}, but this "
                "worker only sends its API key to ORGA_BASE_URL "
                f"({redact_url(configured) if configured else 'the provider default'}); "
                "remove base_url from the task or set ORGA_ALLOW_TASK_BASE_URL=true for trusted "
                "submitters"
            )
        overrides: dict[str, Any] = {
            "provider": ProviderKind(spec.kind) if spec.kind else None,
            "model": spec.model,
            "base_url": spec.base_url.rstrip("/") if spec.base_url else None,
            "script_path": Path(spec.script) if spec.script else None,
        }
        update = {k: v for k, v in overrides.items() if v is not None}
        if switched:  # ORGA_API_KEY and ORGA_BASE_URL belong to ORGA_PROVIDER
            update = {"api_key": None, "base_url": overrides["base_url"], **update}
        return deployment.model_copy(update=update)

    def tool_definitions(self) -> list[ToolDefinition]:
        """Every tool of the registry."""
        return self.registry.definitions()

    def mcp_servers(self, config: LoopConfig) -> tuple[McpServerSpec, ...]:
        """The deployment's MCP servers and the task's (ConfigError on a name clash)."""
        return combined_servers(self.mcp_deployment_servers, config.mcp_servers or ())

    async def mcp_listing(
        self, request: ReasonRequest | ToolRequest, *, here: bool = False
    ) -> McpListing | None:
        """The task's MCP tools, listed once for the task (None: it has no MCP server); when
        not kept yet, listed by this process (``here``: a tool worker) or by a tool worker."""
        servers = self.mcp_servers(request.config)
        if not servers:
            return None
        task_id = request.fence.task_id
        listing = await self.cached_mcp_listing(task_id)
        if listing is not None:
            return listing
        refused = await self.refused_mcp_start(request)
        if refused is not None:
            return McpListing(error=refused)
        ask = self.serve_mcp_listing if here else self.request_mcp_listing
        return await ask(
            McpListRequest(
                task_id=task_id,
                workspace=request.workspace,
                workspace_template=request.workspace_template,
                workspace_base=request.workspace_base,
                servers=list(request.config.mcp_servers or ()),
                reply_key="",
            )
        )

    async def refused_mcp_start(self, request: ReasonRequest | ToolRequest) -> str | None:
        """Why one of the task's own stdio servers may not start (its command judged by the
        task's gate as a ``run_command`` call: :mod:`workers.gates.server_start`), or None.

        Asked before a listing is served, on whichever worker asks for it (a reasoning worker,
        or a tool worker that finds no listing kept): a listing is kept only after this
        passed, and the tool workers start a task's servers only for a listing or a call of a
        listed tool. The deployment's servers (``ORGA_MCP_SERVERS``) are not gated."""
        own = request.config.mcp_servers or ()
        if not any(spec.command is not None for spec in own):
            return None
        fence = request.fence
        context = GateContext(
            agent_id=request.agent_id,
            workspace=Path(request.workspace),
            task_id=fence.task_id,
            step_id=fence.step_id,
            iteration=fence.iteration,
            delegation_depth=request.config.delegation_depth,
        )
        return await refused_server_start(self.gate(request.policy), own, context)

    async def cached_mcp_listing(self, task_id: str) -> McpListing | None:
        """The listing kept for the task (in this process; in Redis for a worker process)."""
        return self._mcp_listings.get(task_id)

    async def request_mcp_listing(self, request: McpListRequest) -> McpListing:
        """List here (this core runs tools itself); a worker process asks a tool worker."""
        return await self.serve_mcp_listing(request)

    async def serve_mcp_listing(self, request: McpListRequest) -> McpListing:
        """Start the task's servers in its workspace and list their tools; keep the listing
        when it succeeded."""
        try:
            servers = combined_servers(self.mcp_deployment_servers, request.servers)
            workspace = await self._mcp_workspace(request)
        except (ConfigError, WorkspacePathError) as exc:
            return McpListing(error=str(exc))
        listing = await self.mcp.list_tools(
            request.task_id, servers, workspace, self.settings.mcp_list_timeout_s
        )
        if listing.error is None:
            await self.keep_mcp_listing(request.task_id, listing)
        return listing

    async def keep_mcp_listing(self, task_id: str, listing: McpListing) -> None:
        """Keep a successful listing for the rest of the task."""
        self._mcp_listings.pop(task_id, None)
        self._mcp_listings[task_id] = listing
        while len(self._mcp_listings) > LEDGERS_KEPT:
            self._mcp_listings.pop(next(iter(self._mcp_listings)))

    async def _mcp_workspace(self, request: McpListRequest) -> Path:
        workspace = Path(request.workspace)
        if request.workspace_base is None:
            return await open_task_workspace(workspace, request.workspace_template)
        opened, _identity = await open_subagent_workspace(
            workspace,
            Path(request.workspace_base),
            self.workspace_claims(),
            request.workspace_template,
        )
        return opened

    def reads_only(self, tool: str) -> bool:
        """Whether ``tool`` is a read-only tool of the registry."""
        return reads_only(self.registry.get(tool))

    def starts_processes(self, tool: str) -> bool:
        """Whether ``tool`` (of the registry, or an MCP tool) starts processes."""
        return starts_processes(self.executor.tools.get(tool))

    async def execute(self, request: ToolRequest, context: ToolContext) -> ToolObservedMessage:
        """Run one call through the executor (breakers and cache shared through Redis)."""
        report = await self.executor.execute(
            [request.action],
            request.config,
            context,
            recovery=request.recovery,
            iteration=request.fence.iteration,
            ledger=self._ledger(request.fence.task_id),
        )
        escalation = report.escalation
        return ToolObservedMessage(
            fence=request.fence,
            observation=report.observations[0],
            recovery_events=list(report.events),
            escalation_reason=(
                f"{escalation.tool_name}: {escalation.error}" if escalation is not None else None
            ),
        )

    def _ledger(self, task_id: str) -> RecoveryLedger:
        """LlmRecovery counts of one task in this process (bounded: oldest tasks forgotten).

        A task's iterations may run on other workers, so the count is per task and process:
        a lower bound of the task's attempts, never shared between tasks.
        """
        ledger = self._ledgers.pop(task_id, None) or RecoveryLedger()
        self._ledgers[task_id] = ledger
        while len(self._ledgers) > LEDGERS_KEPT:
            self._ledgers.pop(next(iter(self._ledgers)))
        return ledger

    def redactor(self) -> Redactor:
        """Redacts the echoes of this process's secrets (every ``SecretStr`` of its settings:
        the model keys, the inbox's tokens)."""
        return self._redactor

    def allow_private_network(self) -> bool:
        """Whether web_fetch (and a task's MCP server over HTTP) may reach loopback and
        private addresses."""
        return self.settings.allow_private_network

    def knowledge(self) -> KnowledgeStore:
        """The agents' knowledge store."""
        return self._knowledge

    def workspace_claims(self) -> WorkspaceClaims:
        """The sub-agent workspace folders the runtime created (in memory, or shared through
        Redis in a worker process)."""
        return self._workspace_claims

    async def conversation(self, request: ReasonRequest) -> Conversation:
        """The request's own conversation (this core has no store to read a reference in)."""
        if request.conversation_ref is not None:
            raise ConfigError(
                f"reasoning request {request.fence.token()} refers to a stored conversation, "
                "but this worker has no Redis to read it from; run it on a worker process"
            )
        return request.conversation

    async def seed_knowledge(self, agent_id: str, spec: KnowledgeSpec) -> None:
        """Add a task's seeded items to the agent's store, once per process and seed (the
        items' ids come from their content, so another process seeding again changes
        nothing)."""
        items = spec.seed_items()
        digest = hashlib.blake2b(
            "\0".join(i.item_id or "" for i in items).encode(), digest_size=16
        ).digest()
        if not items or (agent_id, digest) in self._seeded:
            return
        for item in items:
            await self._knowledge.add_knowledge(agent_id, item)
        self._seeded[(agent_id, digest)] = None
        while len(self._seeded) > SCRIPTS_KEPT:
            self._seeded.pop(next(iter(self._seeded)))

    def gate(self, policy: PolicySpec) -> ReasoningPolicyGate:
        """The gate of a policy spec, built once per distinct spec in this process."""
        key = policy.model_dump_json()
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = build_gate(policy)
        return gate


class ProcessServices(WorkerCore):
    """A worker process's services: a :class:`WorkerCore` on Redis-backed breakers, cache and
    knowledge, with the process's event loop thread, heartbeats and publishing."""

    def __init__(
        self,
        settings: OrgaSettings,
        provider_settings: ProviderSettings,
        redis_url: str,
        registry: ToolRegistry | None = None,
        connect: Callable[..., Redis] | None = None,
    ) -> None:
        """``connect``: builds the state's client (the Celery app's ``WorkerConfig.async_redis``, a
        RedisCluster on a cluster); None: a standalone Redis at ``redis_url``."""
        self.loop = new_event_loop()
        self._loop_thread = threading.Thread(
            target=self.loop.run_forever, name="orga-loop", daemon=True
        )
        self._loop_thread.start()
        options: dict[str, Any] = {
            "max_connections": max(64, settings.reasoning_concurrency + 16),
            "driver_info": DRIVER_INFO,
        }
        self.redis: Redis = (
            connect(**options) if connect is not None else Redis.from_url(redis_url, **options)
        )
        self.liveness = Liveness(
            self.redis,
            settings.heartbeat_interval_s,
            settings.heartbeat_timeout_s,
            partitions=settings.partitions,
        )
        knowledge = RedisKnowledgeStore(self.redis)
        registry = with_knowledge(registry or default_registry(), knowledge)
        tools: dict[str, Tool] = {t.definition.name: t for t in registry}
        # redis-py's cluster pipeline has no command stack to coalesce into: one per caller.
        self.pipelines: CoalescedPipeline | OwnPipeline = (
            OwnPipeline(self.redis) if settings.redis_cluster else CoalescedPipeline(self.redis)
        )
        """The starts and breaker checks of one loop turn go out in one pipeline."""
        # A breaker check is an HMGET in the loop turn's pipeline; a success after a clean
        # check writes nothing.
        self.breaker_store = RedisBreakerStore(self.redis, pipelines=self.pipelines)
        executor = ToolExecutor(
            tools,
            CircuitBreakerRegistry(self.breaker_store),
            cache=RedisResultCache(self.redis),
            dead_letter=RedisDeadLetterSink(self.redis, settings.partitions),
            applied=RedisAppliedCalls(self.redis),
        )
        super().__init__(settings, provider_settings, executor, registry, knowledge)
        self._workspace_claims = RedisWorkspaceClaims(self.redis)
        self._cluster = settings.redis_cluster
        """A Redis Cluster: one transaction per slot (:meth:`publish`)."""
        self._conversations: dict[str, tuple[tuple[float, int], list[ConversationMessage]]] = {}
        """Task id → ((created_at, epoch), the messages of its conversation read so far)."""
        self._hold_keys: dict[tuple[str | None, ...], str | None] = {}
        self._hold_reads = HoldReads()
        """The rate-limit holds read lately (a start within HOLD_FRESH_S takes the last read)."""
        self.mcp_list_sender: Callable[[McpListRequest], object] | None = None
        """Sends ``orga.mcp_list`` to the tools queue (set by :mod:`workers.tasks`)."""
        self._mcp_reaper: asyncio.Task[None] | None = None
        self.mcp.on_open = self._reap_mcp_connections
        self.mcp.active_tasks = self._active_tasks
        """A task's provider choice → the rate-limit hold its model calls read."""

    async def started(
        self, request: ReasonRequest | ToolRequest, fences: Sequence[Fence], queue: str
    ) -> None:
        """Say that the dispatch started (:meth:`Liveness.start`) and, for a reasoning request,
        read the messages of its stored conversation that this process lacks, in the same
        round trip (:meth:`conversation` then has them), shared with the other calls that start
        or check a breaker in this loop turn (:class:`~workers.redis_batch.CoalescedPipeline`).
        A start that raises (or is cancelled) stops heartbeating ``fences``: the caller runs
        nothing and calls :meth:`Liveness.finished` only for a dispatch that started."""
        ref = request.conversation_ref if isinstance(request, ReasonRequest) else None
        task_id = request.fence.task_id
        known, read_to = self._known(task_id, ref) if ref is not None else ([], 0)
        lacking = len(known) < read_to
        hold = self._hold_key(request) if isinstance(request, ReasonRequest) else None
        # A hold this process read less than HOLD_FRESH_S ago is taken as it was read.
        fresh, kept_hold = self._hold_reads.fresh(hold) if hold is not None else (False, None)
        read_hold = hold is not None and not fresh

        look_at = request.look_at if isinstance(request, ReasonRequest) else None
        # The start's ZADD of orga:heartbeats is shared with the other starts of this loop
        # turn (one ZADD for all: SharedZadd); the look's pull, if any, goes with its reads.
        write = self.liveness.starting(fences, queue, look_at)

        def build(pipe: Pipeline) -> None:
            write.pull(pipe)
            if lacking:
                pipe.lrange(self._conversation_key(task_id), len(known), read_to - 1)
            if read_hold and hold is not None:
                pipe.get(hold)

        try:
            replies = await self.pipelines.run(build, SharedZadd(keys.heartbeats_key, write.beats))
            sent = write.sent
            self.liveness.check_start(replies, write)
            if hold is not None and not read_hold:
                read_ahead(hold, kept_hold)
            elif hold is not None:
                held = replies.pop()
                if held is None or isinstance(held, bytes):
                    self._hold_reads.saw(hold, held)
                    read_ahead(hold, held)
            if ref is not None and len(replies) > sent:
                self._read_ahead(task_id, ref, known, replies[sent])
        except BaseException:
            self.liveness.give_back(write)  # the answer marks it carried wait for the next write
            self.liveness.finished(fences)
            raise

    def _read_ahead(
        self, task_id: str, ref: ConversationRef, known: list[ConversationMessage], raw: object
    ) -> None:
        """Keep the messages read at the start (:meth:`conversation` reads again, and raises
        there, if they are an error or not what ``ref`` says)."""
        if not isinstance(raw, list):
            return
        try:
            read = [shared_message(m) for m in raw]
        except ValueError:
            return
        if len(known) + len(read) == ref.tail_start:
            self._keep(task_id, ref, known + read + ref.tail)

    def _hold_key(self, request: ReasonRequest) -> str | None:
        """The rate-limit hold the request's model call will read (:class:`RedisThrottle`),
        None for a scripted model or a provider choice that fails (the call says why)."""
        spec = request.provider
        if spec.replies is not None:
            return None
        choice = (spec.kind, spec.model, spec.base_url, spec.script)
        if choice in self._hold_keys:
            return self._hold_keys[choice]
        try:
            settings = self._provider_settings(spec)
            scripted = settings.provider is ProviderKind.SCRIPTED
            if scripted and settings.script_path is not None:
                hold = None
            else:
                base_url = settings.resolved_base_url() or ""
                api_key = settings.resolved_api_key()
                digest = key_digest(base_url, api_key.get_secret_value() if api_key else "")
                hold = keys.provider_limit_key(settings.provider.value, digest)
        except ConfigError:
            return None
        self._hold_keys[choice] = hold
        while len(self._hold_keys) > SCRIPTS_KEPT:
            self._hold_keys.pop(next(iter(self._hold_keys)))
        return hold

    async def conversation(self, request: ReasonRequest) -> Conversation:
        """The stored conversation a request refers to: what this process read of the task
        before (same epoch), plus the messages it lacks, read from Redis."""
        ref = request.conversation_ref
        if ref is None:
            return request.conversation
        task_id = request.fence.task_id
        known, read_to = self._known(task_id, ref)
        if len(known) < read_to:
            key = self._conversation_key(task_id)
            raw = await self.redis.lrange(key, len(known), read_to - 1)
            known = known + [shared_message(m) for m in raw]
        if len(known) == ref.tail_start:
            known = known + ref.tail
        if len(known) < ref.length:
            self._conversations.pop(task_id, None)
            raise StaleConversationError(
                f"task {task_id}: its stored conversation has {len(known)} messages, the "
                f"request {request.fence.token()} expects {ref.length} (epoch {ref.epoch}); "
                "it was rewritten since: the coordinator will re-send a current request"
            )
        self._keep(task_id, ref, known)
        return Conversation(messages=list(known[: ref.length]))

    def _known(self, task_id: str, ref: ConversationRef) -> tuple[list[ConversationMessage], int]:
        """What this process holds of the request's conversation, and up to where it must
        read the rest from Redis: nothing when what it read before reaches the request's
        tail (the request then carries the rest), else up to the tail, or to the end when
        the request carries none."""
        kept = self._kept(task_id, ref)
        start = ref.tail_start
        if ref.tail and len(kept) >= start:
            return kept[:start] + ref.tail, 0
        return kept, start

    def _kept(self, task_id: str, ref: ConversationRef) -> list[ConversationMessage]:
        """What this process read of the task's conversation before, if of the same epoch and
        not longer than ``ref`` says (a rewritten conversation is read again)."""
        version, cached = self._conversations.get(task_id, ((-1.0, -1), []))
        same = version == (ref.created_at, ref.epoch)
        return cached if same and len(cached) <= ref.length else []

    def _keep(self, task_id: str, ref: ConversationRef, known: list[ConversationMessage]) -> None:
        """Remember the task's conversation (the newest CONVERSATIONS_KEPT tasks')."""
        self._conversations.pop(task_id, None)
        self._conversations[task_id] = ((ref.created_at, ref.epoch), known[: ref.length])
        while len(self._conversations) > CONVERSATIONS_KEPT:
            self._conversations.pop(next(iter(self._conversations)))

    def throttle(self, provider: str, digest: str) -> ProviderThrottle:
        """Every worker of the deployment holds off together: one Redis key per provider and
        key (:mod:`workers.providers.rate_limit`)."""
        key = keys.provider_limit_key(provider, digest)
        return RedisThrottle(self.redis, key, reads=self._hold_reads)

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine on this process's loop and wait for it (from any thread but the
        loop's own)."""
        if threading.current_thread() is self._loop_thread:
            coroutine.close()
            raise RuntimeError(
                "ProcessServices.run called on the process's own loop thread, which it would "
                "block forever; await the coroutine there instead"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        """Close the HTTP clients, the heartbeats, the Redis client, then the loop."""
        if self.loop.is_closed():
            return
        self.run(self._aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        self.loop.close()

    async def _aclose(self) -> None:
        if self._mcp_reaper is not None:
            await cancel_and_wait(self._mcp_reaper)
        await self.liveness.close()
        await self.aclose()
        await self.pipelines.aclose()
        await self.redis.aclose()

    # -- publishing -----------------------------------------------------------------------

    async def publish(
        self,
        message: ReasonedMessage | ToolObservedMessage | WorkerFailedMessage | None,
        onward: Sequence[ToolRequest] = (),
        answered: Sequence[Fence] = (),
    ) -> None:
        """Send an observation to the coordinators and the tool calls a reasoning worker
        chains to the tool workers (on the outbox), all or nothing, then mark the dispatches
        now ``answered`` (:class:`~workers.liveness.Liveness`).

        The answer's writes are the task's (one partition). Two or more (an observation and
        the calls it chains, several chained calls) are one ``MULTI`` transaction. A single
        write is atomic on its own: it goes out without ``MULTI``/``EXEC`` (two commands fewer
        per model call), in a non-transactional pipeline shared with the other calls of this
        loop turn (:class:`~workers.redis_batch.CoalescedPipeline`).

        The marks: an answer with an observation is on the stream once its write is in; its
        "direct" marks then wait for the next heartbeat write this process sends (a start's
        or a beat's ``ZADD``, or one of their own within
        :data:`~workers.liveness.MARK_DELAY_S`: :meth:`Liveness.answered_later`), so they are
        never written for an answer Redis refused. An answer carried by the calls it chained
        (no observation) is marked "chained" with its write: in the transaction (on a Redis
        Cluster, where a transaction stays in one slot, in a pipeline after it), or after the
        single write in its pipeline. Once the answer is written, an error of those marks is
        logged, never raised (a caller retrying the publish would send the answer twice). A
        mark left unwritten is as a worker dying right after a publish: the coordinator has
        the answer, and a re-sent dispatch is fenced. A chained mark written while its single
        write was refused (Redis out of memory between the two commands, then not) makes the
        coordinator wait for an answer that is not in the outbox: the write's error is
        raised, so the caller publishes again (:func:`workers.tasks._publish`), and if it
        never can, the coordinator judges the dispatch lost two heartbeat timeouts after the
        mark (``coordinator/liveness.py``) and sends it again."""
        writes = (message is not None) + len(onward)
        if writes <= 1:
            await self._publish_one(message, onward, answered)
            return
        pipe = self.redis.pipeline(transaction=True)
        rest = self.redis.pipeline(transaction=False) if self._cluster else pipe
        # With an observation the answer is on the stream: its mark waits for the next
        # heartbeat write (Liveness.answered_later). Without one, the calls carry it.
        if message is None:
            self.liveness.answered(rest, answered, chained=bool(onward))
        self._add_writes(pipe, message, onward)
        await pipe.execute()
        if message is not None:
            self.liveness.answered_later(answered)
        if rest is not pipe and len(rest):
            try:
                await rest.execute()
            except RedisError as exc:  # after the commit: re-sending it would duplicate it
                log.warning(
                    "publish.after_commit_failed",
                    extra={"error": str(exc)[:300], "commands": len(rest)},
                )

    async def _publish_one(
        self,
        message: ReasonedMessage | ToolObservedMessage | WorkerFailedMessage | None,
        onward: Sequence[ToolRequest],
        answered: Sequence[Fence],
    ) -> None:
        """:meth:`publish` of at most one write, in a shared non-transactional pipeline: a
        lone chained call with its marks after it (the write's error is raised, the marks'
        logged); an observation alone, its marks left to the next heartbeat write once it is
        in (:meth:`~workers.liveness.Liveness.answered_later`)."""
        chained = message is None and bool(onward)
        writes = (message is not None) + len(onward)

        def build(pipe: Pipeline) -> None:
            self._add_writes(pipe, message, onward)
            if message is None:
                self.liveness.answered(pipe, answered, chained=chained)

        replies = await self.pipelines.run(build)
        for reply in replies[:writes]:
            if isinstance(reply, Exception):
                raise reply
        if message is not None:
            self.liveness.answered_later(answered)
        failed = [r for r in replies[writes:] if isinstance(r, Exception)]
        if failed:
            log.warning(
                "publish.after_commit_failed",
                extra={"error": str(failed[0])[:300], "commands": len(replies) - writes},
            )

    def _add_writes(
        self,
        pipe: Pipeline,
        message: ReasonedMessage | ToolObservedMessage | WorkerFailedMessage | None,
        onward: Sequence[ToolRequest],
    ) -> None:
        """The answer's writes: the observation, then the chained calls (sent to Celery by a
        coordinator's relay, :mod:`coordinator.relay`), all in the task's partition."""
        if message is not None:
            pipe.xadd(
                keys.observations_stream(self._partition(message.fence.task_id)),
                encode_entry(message),  # type: ignore[arg-type]
                maxlen=keys.observations_maxlen,
                approximate=True,
            )
        for request in onward:
            outbox = keys.outbox_stream(self._partition(request.fence.task_id))
            pipe.xadd(outbox, tool_entry(request).fields())  # type: ignore[arg-type]

    def _partition(self, task_id: str) -> int:
        return keys.partition_of(task_id, self.settings.partitions)

    # -- MCP listings ----------------------------------------------------------------------

    async def cached_mcp_listing(self, task_id: str) -> McpListing | None:
        """The task's listing as a tool worker stored it in Redis (shared by every worker)."""
        kept = await super().cached_mcp_listing(task_id)
        if kept is not None:
            return kept
        raw = await self.redis.get(keys.mcp_tools_key(task_id, self._partition(task_id)))
        if raw is None:
            return None
        listing = McpListing.model_validate_json(raw)
        await super().keep_mcp_listing(task_id, listing)
        return listing

    async def keep_mcp_listing(self, task_id: str, listing: McpListing) -> None:
        """Keep the listing here and in Redis, for the task's other workers."""
        await super().keep_mcp_listing(task_id, listing)
        key = keys.mcp_tools_key(task_id, self._partition(task_id))
        await self.redis.set(key, listing.to_json(), ex=keys.mcp_tools_ttl_s)

    async def request_mcp_listing(self, request: McpListRequest) -> McpListing:
        """Ask a tool worker (``orga.mcp_list`` on the tools queue) to list the task's MCP
        tools, and wait for its answer; list here when no sender is set (a tool worker)."""
        send = self.mcp_list_sender
        if send is None:
            return await self.serve_mcp_listing(request)
        nonce = uuid.uuid4().hex
        reply = keys.mcp_reply_key(request.task_id, nonce, self._partition(request.task_id))
        await asyncio.to_thread(send, request.model_copy(update={"reply_key": reply}))
        wait_s = self.settings.mcp_list_timeout_s * 2 + 5
        deadline = time.monotonic() + wait_s
        # Short waits: one blocking read longer than the client's socket timeout would fail.
        while (answer := await self.redis.blpop([reply], timeout=1)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no tool worker listed the MCP tools of task {request.task_id} within "
                    f"{wait_s:g}s; is a tool worker (orga worker --role tools) running?"
                )
        return McpListing.model_validate_json(answer[1])

    def _reap_mcp_connections(self) -> None:
        """Start the reaper of this process's MCP connections, unless it runs."""
        if self._mcp_reaper is None or self._mcp_reaper.done():
            self._mcp_reaper = asyncio.get_running_loop().create_task(self._reap_mcp())

    async def _active_tasks(self, task_ids: list[str]) -> set[str]:
        """Those of ``task_ids`` that have not ended (in ``orga:{p:NN}:tasks:deadlines``, which
        holds a task from its creation to its end; a task awaiting a review is active)."""
        by_partition: dict[int, list[str]] = {}
        for task_id in task_ids:
            by_partition.setdefault(self._partition(task_id), []).append(task_id)
        active: set[str] = set()
        for partition, members in by_partition.items():
            found = await self.redis.zmscore(keys.deadlines_key(partition), members)
            active.update(t for t, score in zip(members, found, strict=True) if score is not None)
        return active

    async def _reap_mcp(self) -> None:
        """While connections are open: every heartbeat interval, close those of the tasks
        that ended (``orga:P:tasks:finished``) and those idle past ORGA_MCP_IDLE_TIMEOUT_S
        whose task is no longer active (:meth:`_active_tasks`)."""
        while self.mcp.task_ids():
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            await self.mcp.close_idle()
            by_partition: dict[int, list[str]] = {}
            for task_id in sorted(self.mcp.task_ids()):
                by_partition.setdefault(self._partition(task_id), []).append(task_id)
            for partition, task_ids in by_partition.items():
                try:
                    ended = await self.redis.zmscore(keys.finished_tasks_key(partition), task_ids)
                except RedisError as exc:
                    log.warning("mcp.reap_failed", extra={"error": str(exc)[:300]})
                    continue
                for task_id, ended_at in zip(task_ids, ended, strict=True):
                    if ended_at is not None:
                        log.info("mcp.task_ended", extra={"task_id": task_id})
                        await self.mcp.close_task(task_id)

    async def answer_mcp_listing(self, request: McpListRequest) -> None:
        """A tool worker's side of ``orga.mcp_list``: list, then push the answer."""
        listing = await self.serve_mcp_listing(request)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(request.reply_key, listing.to_json())
            pipe.expire(request.reply_key, keys.mcp_reply_ttl_s)
            await pipe.execute()

    def _conversation_key(self, task_id: str) -> str:
        return keys.conversation_key(task_id, self._partition(task_id))

    async def dead_letter_payload(self, task_name: str, payload: str, error: str) -> None:
        """A payload that cannot even be decoded: kept for operators, never retried."""
        await self.redis.xadd(
            keys.dead_letter_stream(0),  # no task to name: the first partition's
            {
                "kind": "undecodable_payload",
                "task": task_name,
                "error": error[:2000],
                "payload": payload[:4096],
                "at": f"{time.time():.3f}",
            },
            maxlen=keys.dead_letter_maxlen,
            approximate=True,
        )


def local_core(
    settings: OrgaSettings | None = None,
    provider_settings: ProviderSettings | None = None,
    registry: ToolRegistry | None = None,
    knowledge: KnowledgeStore | None = None,
) -> WorkerCore:
    """A :class:`WorkerCore` for one process: in-memory breakers, result cache and (unless
    given) knowledge store."""
    store = knowledge if knowledge is not None else InMemoryKnowledgeStore()
    registry = with_knowledge(registry or default_registry(), store)
    executor = ToolExecutor(
        {t.definition.name: t for t in registry},
        CircuitBreakerRegistry(InMemoryBreakerStore()),
        cache=InMemoryResultCache(),
    )
    return WorkerCore(
        settings or OrgaSettings(),
        provider_settings or ProviderSettings(),
        executor,
        registry,
        store,
    )


def with_knowledge(registry: ToolRegistry, store: KnowledgeStore) -> ToolRegistry:
    """``registry`` with ``recall_knowledge`` and ``store_knowledge`` on ``store`` (the model
    sees them only in tasks with a ``knowledge`` block)."""
    for tool in knowledge_tools(store):
        if tool.definition.name not in registry:
            registry.register(tool)
    return registry


def deployment_mcp_servers(settings: OrgaSettings) -> tuple[McpServerSpec, ...]:
    """The servers of the ``ORGA_MCP_SERVERS`` file, read once at the process edge;
    ConfigError naming the file when it cannot be read or is not valid."""
    path = settings.mcp_servers
    if path is None:
        return ()
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"ORGA_MCP_SERVERS={str(path)!r} cannot be read: {exc.strerror}; point it at a "
            "JSON or YAML file listing the MCP servers, or unset it"
        ) from exc
    return parse_mcp_servers(text, f"ORGA_MCP_SERVERS file {str(path)!r}")


def _command_limits(registry: ToolRegistry) -> CommandLimits | None:
    """The rlimits ``run_command`` gives commands (a stdio MCP server gets the same)."""
    tool = registry.get("run_command")
    return tool.limits if isinstance(tool, RunCommandTool) else None


def _command_environment(registry: ToolRegistry) -> CommandEnvironment | None:
    """The environment ``run_command`` gives commands (a stdio MCP server gets the same)."""
    tool = registry.get("run_command")
    return tool.environment if isinstance(tool, RunCommandTool) else None
