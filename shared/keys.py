"""Every Redis key, stream, consumer group and TTL of orga-queue, in one place.

Nothing else in the project spells a Redis name: import it from here (arq keeps its names the
same way). Units are part of the names (``_s`` seconds, ``_ms`` milliseconds). Keys that carry a
parameter are built by a function, next to the prefix it uses. This module is pure: no Redis
import, no I/O.

Partitions
    Every key of a task, and every stream, index and counter a commit touches, belongs to one
    of ``ORGA_PARTITIONS`` partitions (fixed at creation, stored in ``orga:partitions``) and
    carries its Redis Cluster hash tag ``{p:NN}``: one commit touches one slot. A task's
    partition is :func:`partition_of` its id (CRC-32 of the root id, so a delegation tree
    shares its root's partition); an idempotency key's is :func:`idempotency_partition`.
    Below, ``P`` stands for ``{p:NN}``.

Streams (one per partition)
    ``orga:P:intake``            task submissions from upstream pipelines (``intake_stream(p)``)
    ``orga:P:rejected``          malformed submissions with their validation error
    ``orga:P:observations``      observations published by workers for the coordinator
    ``orga:P:events``            task lifecycle events upstream pipelines follow
    ``orga:P:review``            escalations waiting for a human decision
    ``orga:P:dead_letter``       poison messages and dead-lettered tool calls
    ``orga:P:journal:{task_id}``  the journal of one task (``journal_stream(task_id, p)``)
    ``orga:P:tokens:{task_id}``  the model's answers of one task as they stream, for watchers
                                 (``tokens_stream(task_id, p)``; ``MAXLEN ~ tokens_maxlen``,
                                 expires ``tokens_ttl_s`` after its last write)
    ``orga:P:control``           review decisions and cancellations sent by the CLI
    ``orga:P:outbox``            dispatches a reasoning worker chained (and an older
                                 coordinator's commits), not yet published to Celery
                                 (``outbox_stream(p)``; never trimmed: see ``outbox_maxlen``)
    ``orga:P:outbox:commits``    dispatches a coordinator's commit wrote and no relay has
                                 published yet (``commit_outbox_stream(p)``; never trimmed)

Consumer groups
    ``orga-coordinators``        the coordinators reading the intake and observations streams
    ``orga-relays``              legacy: the outbox relays' group before issue 27 (a relay now
                                 reads ``orga:P:outbox`` with ``XREAD``, no group:
                                 ``legacy_outbox_group``)
    ``orga-webhooks``            the webhook deliverers reading ``orga:P:events``

Keys
    ``orga:partitions``          string: the number of partitions (``partitions_key``)
    ``orga:P:task:{task_id}``    hash: the persisted state of a task (``task_key``)
    ``orga:P:lease:{task_id}``   string: the coordinator holding a task (``lease_key``); left
                                 to expire once the task ended
    ``orga:P:partition_lease``   string: the coordinator serving the partition's streams and
                                 relay (``partition_lease_key``)
    ``orga:coordinators``        sorted set: coordinator name -> its last membership heartbeat
                                 (Redis server time, ms; ``coordinators_key``)
    ``orga:P:idem:{key}``        string: task id for an idempotency key (``idempotency_key``)
    ``orga:knowledge:{agent_id}``  the knowledge of one agent (``knowledge_key``)
    ``orga:breaker:{tool}``      hash: the circuit breaker of one tool, shared by every worker
    ``orga:result:{tool}:{sha256}``  string: last successful result of a call (CachedResult)
    ``orga:P:journal_seq:{task_id}``  string: the last journal sequence of a task, written by
                                 versions before issue 27 only (the journal stream's last id
                                 ``0-{last+1}`` holds it now); the retention purge deletes it
    ``orga:P:conversation:{task_id}``  list: a task's conversation (message JSON)
    ``orga:P:tasks:active``      set: tasks not yet ended, written by versions before issue 27's
                                 branch ``actset`` only (the deadline index says which tasks are
                                 active now); unused, deleted by hand once no older version runs
    ``orga:P:tasks:index``       sorted set: every task by creation time
    ``orga:P:tasks:deadlines``   sorted set: active tasks by the time they must be looked at; a
                                 task is in it from its creation to its end, and only then
                                 (what says whether a task is active: ``deadlines_key``)
    ``orga:P:tasks:finished``    sorted set: finished tasks by the time they ended (retention)
    ``orga:P:reviews:open``      hash: review id -> open escalation (JSON)
    ``orga:applied:{sha256}``    string: the result of a writing tool call applied once, by its
                                 idempotency key (``applied_call_key``)
    ``orga:workspace:{sha256}``  string: the identity (device:inode) of a sub-agent's workspace
                                 folder the runtime created, by a digest of its path
                                 (``workspace_claim_key``)
    ``orga:P:mcp_tools:{task_id}``  string: the task's MCP tool listing (JSON), kept for the
                                 task so a flapping server does not make tools vanish
    ``orga:P:mcp_reply:{task_id}:{nonce}``  list: a tool worker's answer to one listing request
    ``orga:P:review_claim:{review_id}``  string: the one decision sent for a review (JSON: by,
                                 decision, entry_id), set with the control entry by one script
    ``orga:P:stats:status``      hash: ``{status}`` -> tasks added in it (create, purge) and
                                 ``{from}>{to}`` -> tasks a commit moved (the commit script);
                                 tasks in each status: :func:`status_counts`, never the fields
    ``orga:heartbeats``          sorted set: dispatch liveness id -> last heartbeat time (a
                                 running call), or minus its end time (answered); workers write;
                                 with a reasoning's answer, its mark (how the answer went
                                 out, :func:`answered_via_member`) -> minus the same time
    ``orga:started:{queue}``     string: how many dispatches of a queue workers have started
    ``orga:agents``              hash: agent name -> registered agent profile (JSON)
    ``orga:{schedules}``           hash: schedule name -> schedule (JSON)
    ``orga:{schedules}:due``       sorted set: active schedule name -> its next fire time
    ``orga:{schedules}:fired``     hash: schedule name -> its last fire (JSON: time, task id,
                                 intake entry)
    ``orga:{schedules}:queued``    hash: schedule name -> the one fire waiting for its last run to
                                 end (``overlap: queue``; JSON: fire time, the run waited for)
    ``orga:ratelimit:{provider}:{digest}``  string: until when (unix ms) every worker holds off
                                 calling one provider with one key (``provider_limit_key``;
                                 the digest is a hash of the base URL and key, never the key)
    ``orga:inbox:session:{sha256}``  string: the reviewer of one inbox login, by a hash of the
                                 session id its signed cookie carries; deleted at logout
                                 (``inbox_session_key``)
    ``orga:inbox:{login_failures}:{kind}:{sha256}``  string: failed inbox logins in the current
                                 window, from one client address (``addr``) or for one user
                                 name (``user``), by a hash of it (``inbox_login_failures_key``)
    ``orga:provider_wait:{liveness_id}``  string: a model call held in a retry wait (JSON:
                                 provider, status, retry_at), expiring when the wait ends
                                 (``provider_wait_key``)

Celery (the Redis broker stores each queue as a list under its name)
    ``orga.reasoning``           queue of reasoning iterations (task ``orga.reason``)
    ``orga.tools``               queue of tool calls (task ``orga.tool_call``)

TTLs
    ``lease_ttl_s``              a task lease not renewed within this time may be taken over
                                 (an ended task's lease lingers up to this long)
    ``partition_lease_ttl_s``    a partition lease (and a coordinator's membership) not renewed
                                 within this time may be taken over
    ``idempotency_ttl_s``        how long a resubmission with the same key returns the same task
    ``breaker_ttl_s``            an idle breaker expires (at least twice its recovery timeout)
    ``result_cache_ttl_s``       a cached tool result expires; caps CachedResult's max_staleness
    ``review_claim_ttl_s``       a review's decision claim expires
    ``applied_call_ttl_s``       the kept result of a call applied once expires
    ``workspace_claim_ttl_s``    a sub-agent workspace's claim expires, unless opened again
    ``inbox_session_ttl_s``      an inbox login ends (its cookie expires with it)
    ``inbox_login_window_s``     the window in which an inbox login's failures are counted
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Final

__all__ = [
    "ANSWERED_CHAINED",
    "ANSWERED_DIRECT",
    "ANSWERED_VIAS",
    "agents_key",
    "answered_via_member",
    "applied_call_key",
    "applied_call_key_prefix",
    "applied_call_ttl_s",
    "breaker_key",
    "breaker_key_prefix",
    "breaker_ttl_s",
    "commit_outbox_flush_s",
    "commit_outbox_stream",
    "commit_outbox_sweep_s",
    "control_maxlen",
    "control_stream",
    "conversation_key",
    "coordinator_group",
    "coordinators_key",
    "dead_letter_maxlen",
    "dead_letter_stream",
    "deadlines_key",
    "events_stream",
    "finished_tasks_key",
    "heartbeats_key",
    "heartbeats_retention_s",
    "idempotency_key",
    "idempotency_partition",
    "idempotency_ttl_s",
    "inbox_login_failures_key",
    "inbox_login_failures_key_prefix",
    "inbox_login_window_s",
    "inbox_session_key",
    "inbox_session_key_prefix",
    "inbox_session_ttl_s",
    "intake_maxlen",
    "intake_stream",
    "journal_sequence_key",
    "journal_stream",
    "key_prefix",
    "knowledge_key",
    "knowledge_key_prefix",
    "lease_key",
    "lease_ttl_s",
    "legacy_active_tasks_key",
    "legacy_intake_stream",
    "legacy_outbox_group",
    "legacy_outbox_stream",
    "legacy_schedule_keys",
    "mcp_list_task_name",
    "mcp_reply_key",
    "mcp_reply_ttl_s",
    "mcp_tools_key",
    "mcp_tools_ttl_s",
    "observations_maxlen",
    "observations_stream",
    "open_reviews_key",
    "outbox_batch",
    "outbox_maxlen",
    "outbox_stream",
    "partition_key_prefix",
    "partition_lease_key",
    "partition_lease_ttl_s",
    "partition_of",
    "partition_streams",
    "partition_tag",
    "partitions_key",
    "provider_limit_key",
    "provider_limit_key_prefix",
    "provider_wait_key",
    "provider_wait_key_prefix",
    "queue_started_key",
    "queue_started_key_prefix",
    "reason_task_name",
    "reasoning_queue",
    "rejected_maxlen",
    "rejected_stream",
    "result_cache_key",
    "result_cache_key_prefix",
    "result_cache_ttl_s",
    "review_claim_key",
    "review_claim_ttl_s",
    "review_stream",
    "schedule_fires_key",
    "schedules_due_key",
    "schedules_key",
    "schedules_queued_key",
    "status_counts",
    "status_counts_key",
    "task_index_key",
    "task_key",
    "tokens_maxlen",
    "tokens_stream",
    "tokens_ttl_s",
    "tool_task_name",
    "tools_queue",
    "webhook_group",
    "workspace_claim_key",
    "workspace_claim_key_prefix",
    "workspace_claim_ttl_s",
]

key_prefix: Final = "orga:"
"""Every key and stream of the project starts with this."""

# -- streams -------------------------------------------------------------------------------


# -- consumer groups -----------------------------------------------------------------------

coordinator_group: Final = "orga-coordinators"
legacy_outbox_group: Final = "orga-relays"
"""The group the outbox relays read every ``outbox_stream(p)`` in before issue 27. A relay now
reads the outbox with ``XREAD`` (the outbox holds only what is not sent yet, and the partition
lease keeps one relay on it): nothing reads or writes this group. A deployment upgraded from an
older version may delete it (``XGROUP DESTROY orga:{p:NN}:outbox orga-relays``) once no older
coordinator runs."""
webhook_group: Final = "orga-webhooks"
"""The webhook deliverers (coordinator/webhooks.py): each reads every ``events_stream(p)`` as its
own consumer, so one event is delivered by one of them; an entry is acknowledged once every
subscription matching it was delivered or dead-lettered."""

# -- keys ----------------------------------------------------------------------------------

knowledge_key_prefix: Final = "orga:knowledge:"
breaker_key_prefix: Final = "orga:breaker:"
result_cache_key_prefix: Final = "orga:result:"
applied_call_key_prefix: Final = "orga:applied:"
workspace_claim_key_prefix: Final = "orga:workspace:"
provider_limit_key_prefix: Final = "orga:ratelimit:"
inbox_session_key_prefix: Final = "orga:inbox:session:"
inbox_login_failures_key_prefix: Final = "orga:inbox:{login_failures}:"
"""One hash tag: the throttle script reads the address's and the name's counters in one slot."""
provider_wait_key_prefix: Final = "orga:provider_wait:"

heartbeats_key: Final = "orga:heartbeats"
ANSWERED_DIRECT: Final = "direct"
"""An answer mark: the answer went out on the observations stream (or nothing went out)."""
ANSWERED_CHAINED: Final = "chained"
"""An answer mark: the answer went out inside the one call a reasoning chained
(``CompleteReasoning``), on the outbox: it reaches the observations stream only once a tool
worker has run that call."""

ANSWERED_VIAS: Final = (ANSWERED_DIRECT, ANSWERED_CHAINED)
"""Every answer mark."""


def answered_via_member(liveness_id: str, via: str) -> str:
    """The member of ``orga:heartbeats`` a worker scores, with a reasoning's answer (minus the
    same time, so that the same retention forgets both), to say how the answer went out:
    ``via`` is :data:`ANSWERED_DIRECT` or :data:`ANSWERED_CHAINED`. A dispatch answered by a
    worker older than these marks has neither."""
    return f"{liveness_id}|answered:{via}"


queue_started_key_prefix: Final = "orga:started:"
agents_key: Final = "orga:agents"
schedules_key: Final = "orga:{schedules}"
schedules_due_key: Final = "orga:{schedules}:due"
schedule_fires_key: Final = "orga:{schedules}:fired"
schedules_queued_key: Final = "orga:{schedules}:queued"
legacy_schedule_keys: Final = {
    "orga:schedules": schedules_key,
    "orga:schedules:due": schedules_due_key,
    "orga:schedules:fired": schedule_fires_key,
    "orga:schedules:queued": schedules_queued_key,
}
"""The schedules' keys before they shared the hash tag ``{schedules}`` (one slot on a Redis
Cluster, for the fire's script and the CLI's transactions) → their names now: a coordinator
renames them at start (:func:`coordinator.schedules.adopt_legacy_schedules`)."""

# -- Celery queues and task names ----------------------------------------------------------

reasoning_queue: Final = "orga.reasoning"
tools_queue: Final = "orga.tools"
reason_task_name: Final = "orga.reason"
tool_task_name: Final = "orga.tool_call"
mcp_list_task_name: Final = "orga.mcp_list"
"""A reasoning worker asks a tool worker (on ``tools_queue``) to list a task's MCP tools."""

# -- stream lengths (approximate trimming, MAXLEN ~) -----------------------------------------

intake_maxlen: Final = 100_000
control_maxlen: Final = 10_000
observations_maxlen: Final = 100_000
rejected_maxlen: Final = 10_000
dead_letter_maxlen: Final = 100_000
tokens_maxlen: Final = 2_000
"""Entries kept per task in ``tokens_stream``: each holds the text that came while the last
write was under way (a few tokens), so this is the last few thousand pieces of text."""

outbox_maxlen: Final = None
"""The outbox is never trimmed (no ``MAXLEN`` on its ``XADD``): ``MAXLEN`` drops the oldest
entries whether or not they were published, and an entry dropped unpublished is a dispatch
lost until its task's observation deadline. A relay removes each entry (``XDEL``) once Celery
has it, so the stream holds only what waits for a relay: it is the relays' pending list."""

# -- the outbox relay -------------------------------------------------------------------------

outbox_batch: Final = 64
"""Entries a relay reads, publishes and removes at a time."""

commit_outbox_flush_s: Final = 0.25
"""A relay removes the committed entries it sent (one ``XDEL`` per partition) at most this long
after sending them: what a relay killed in between leaves to be sent again by the next one."""

commit_outbox_sweep_s: Final = 5.0
"""A relay reads the commits' outbox of every partition it serves from ``0-0`` this often (and
at start and takeover), for entries no hand-off brought (a commit of a coordinator that has
since lost the partition, a hand-off dropped during a broker outage)."""

# -- TTLs ----------------------------------------------------------------------------------

lease_ttl_s: Final = 30
partition_lease_ttl_s: Final = 10
"""A coordinator renews its partition leases and its membership every third of this; a dead
one's partitions are taken over this long after its last renewal
(``ORGA_PARTITION_LEASE_TTL_S``)."""
idempotency_ttl_s: Final = 7 * 24 * 3600
breaker_ttl_s: Final = 24 * 3600
result_cache_ttl_s: Final = 3600
heartbeats_retention_s: Final = 600
"""Liveness entries (running, answered) older than this are trimmed by the coordinators."""
review_claim_ttl_s: Final = 7 * 24 * 3600
"""How long the claim of a decided review is kept (a late second decision is refused by it)."""
applied_call_ttl_s: Final = 24 * 3600
"""How long the result of a call applied once is kept (a duplicate later than this runs again)."""
mcp_tools_ttl_s: Final = 7 * 24 * 3600
"""A task's MCP tool listing is kept this long (tasks that run longer list again)."""
mcp_reply_ttl_s: Final = 300
"""How long a tool worker's answer to an MCP tool listing request (``mcp_reply_key``) is kept
for the coordinator waiting on it (an answer nobody took expires with it)."""
workspace_claim_ttl_s: Final = 30 * 24 * 3600
"""How long the runtime remembers creating a sub-agent's workspace folder after it was last
opened (a sub-agent idle for longer is refused its folder: it was not seen to be the runtime's)."""
inbox_session_ttl_s: Final = 14 * 24 * 3600
"""How long an inbox login lasts at most (its cookie expires with it)."""
inbox_login_window_s: Final = 60
"""The window in which an inbox login's failures are counted."""
tokens_ttl_s: Final = 3600
"""A task's ``tokens_stream`` expires this long after its last write (its answers are in the
conversation and the journal; the stream is only for watching them come)."""


def knowledge_key(agent_id: str) -> str:
    """The knowledge of one agent: ``orga:knowledge:{agent_id}``."""
    return f"{knowledge_key_prefix}{agent_id}"


def breaker_key(tool_name: str) -> str:
    """The circuit breaker of one tool, shared by every worker: ``orga:breaker:{tool}``."""
    return f"{breaker_key_prefix}{tool_name}"


def result_cache_key(tool_name: str, arguments_digest: str) -> str:
    """The last good result of a tool for canonical arguments: ``orga:result:{tool}:{sha256}``."""
    return f"{result_cache_key_prefix}{tool_name}:{arguments_digest}"


def applied_call_key(digest: str) -> str:
    """The result of a call applied once, by its key's digest: ``orga:applied:{sha256}``."""
    return f"{applied_call_key_prefix}{digest}"


def workspace_claim_key(digest: str) -> str:
    """The identity of a sub-agent workspace folder the runtime created, by its path's digest:
    ``orga:workspace:{sha256}``."""
    return f"{workspace_claim_key_prefix}{digest}"


def queue_started_key(queue: str) -> str:
    """How many dispatches of one Celery queue workers have started: ``orga:started:{queue}``."""
    return f"{queue_started_key_prefix}{queue}"


def provider_limit_key(provider: str, key_digest: str) -> str:
    """Until when every worker holds off one provider and key (a 429's Retry-After):
    ``orga:ratelimit:{provider}:{digest}``; ``key_digest`` is a hash, never the key."""
    return f"{provider_limit_key_prefix}{provider}:{key_digest}"


def inbox_session_key(session_digest: str) -> str:
    """The reviewer of one inbox login: ``orga:inbox:session:{sha256}``; ``session_digest`` is
    a hash of the session id, never the id."""
    return f"{inbox_session_key_prefix}{session_digest}"


def inbox_login_failures_key(kind: str, digest: str) -> str:
    """Failed inbox logins in the current window, from one address (``kind`` ``addr``) or for one
    user name (``user``): ``orga:inbox:{login_failures}:{kind}:{sha256}``."""
    return f"{inbox_login_failures_key_prefix}{kind}:{digest}"


def provider_wait_key(liveness_id: str) -> str:
    """A model call held in its retry wait, by the dispatch's liveness id (``Fence.liveness_id``):
    ``orga:provider_wait:{liveness_id}``."""
    return f"{provider_wait_key_prefix}{liveness_id}"


# -- partitions ------------------------------------------------------------------------------

partitions_key: Final = "orga:partitions"
"""The number of partitions of the deployment, set once (``SET NX``) by the first process
started on it; every process started with another ``ORGA_PARTITIONS`` refuses."""

partition_key_prefix: Final = "orga:{p:"
"""Every partitioned key starts with this (``orga:{p:NN}:``)."""

legacy_active_tasks_key: Final = "orga:tasks:active"
legacy_intake_stream: Final = "orga:intake"
legacy_outbox_stream: Final = "orga:outbox"
"""Keys of the layout before partitions: a coordinator finding tasks still active, an intake
entry not handled or a dispatch not published there refuses to start (they would never be
driven again); drain the deployment with the old version first (docs/deploy.md)."""


def partition_of(task_id: str, partitions: int) -> int:
    """The partition of a task: CRC-32 (``zlib.crc32``, the same on every machine and Python,
    never ``hash()``) of its root task id, the part before the first ``.``, modulo
    ``partitions``. A sub-agent's id is ``{parent}.{n}``: a delegation tree lives in its
    root's partition, so a child's ``child_finished`` (written in the child's commit) reaches
    its parent's observations stream in the same slot."""
    root = task_id.split(".", 1)[0]
    return zlib.crc32(root.encode("utf-8", "surrogatepass")) % partitions


def idempotency_partition(key: str, partitions: int) -> int:
    """The partition of an idempotency key: CRC-32 of the whole key modulo ``partitions``.
    A task submitted with an idempotency key gets an id in that partition (the client draws
    one; an id given with the key must fall in it), so the key is checked and the task
    created by one script in one slot, whichever id a retry carries."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def partition_tag(partition: int) -> str:
    """The Redis Cluster hash tag of a partition: ``{p:NN}`` (two digits at least)."""
    return f"{{p:{partition:02d}}}"


def _in(partition: int, name: str) -> str:
    return f"orga:{partition_tag(partition)}:{name}"


def intake_stream(partition: int) -> str:
    """Task submissions of one partition: ``orga:{p:NN}:intake``."""
    return _in(partition, "intake")


def rejected_stream(partition: int) -> str:
    """Malformed submissions of one partition: ``orga:{p:NN}:rejected``."""
    return _in(partition, "rejected")


def observations_stream(partition: int) -> str:
    """Observations for the tasks of one partition: ``orga:{p:NN}:observations``."""
    return _in(partition, "observations")


def events_stream(partition: int) -> str:
    """Lifecycle events of one partition's tasks: ``orga:{p:NN}:events``."""
    return _in(partition, "events")


def review_stream(partition: int) -> str:
    """Escalations of one partition's tasks: ``orga:{p:NN}:review``."""
    return _in(partition, "review")


def dead_letter_stream(partition: int) -> str:
    """Poison messages of one partition: ``orga:{p:NN}:dead_letter``."""
    return _in(partition, "dead_letter")


def control_stream(partition: int) -> str:
    """Review decisions and cancellations for one partition's tasks: ``orga:{p:NN}:control``."""
    return _in(partition, "control")


def outbox_stream(partition: int) -> str:
    """Dispatches of one partition committed and not yet published: ``orga:{p:NN}:outbox``."""
    return _in(partition, "outbox")


def commit_outbox_stream(partition: int) -> str:
    """Dispatches of one partition a coordinator's commit wrote, not yet published:
    ``orga:{p:NN}:outbox:commits``. Apart from :func:`outbox_stream` so that the relay's blocking
    read of the workers' chained calls is not woken by every commit: the committing
    coordinator hands its entries to its relay in-process, and the relay reads this stream only
    at start, at a partition's takeover and on a slow sweep (``commit_outbox_sweep_s``)."""
    return _in(partition, "outbox:commits")


def task_index_key(partition: int) -> str:
    """Sorted set: the partition's tasks by creation time, ``orga:{p:NN}:tasks:index``."""
    return _in(partition, "tasks:index")


def deadlines_key(partition: int) -> str:
    """Sorted set: active tasks by when they must be looked at, ``orga:{p:NN}:tasks:deadlines``.

    A task is in it from its creation to its end (its terminal commit removes it), and only
    then: whether a task is active is whether it has a score here (``ZSCORE``, ``ZMSCORE``).
    Only the create and commit scripts add members; a worker's start pulls a look forward
    with ``ZADD XX LT``, which never adds one."""
    return _in(partition, "tasks:deadlines")


def finished_tasks_key(partition: int) -> str:
    """Sorted set: finished tasks by end time (retention), ``orga:{p:NN}:tasks:finished``."""
    return _in(partition, "tasks:finished")


def open_reviews_key(partition: int) -> str:
    """Hash: review id -> open escalation (JSON), ``orga:{p:NN}:reviews:open``."""
    return _in(partition, "reviews:open")


def status_counts_key(partition: int) -> str:
    """Hash: tasks of the partition in each status, ``orga:{p:NN}:stats:status``: a field
    ``{status}`` adds its value to the status, a field ``{from}>{to}`` (a commit's change of
    status, one ``HINCRBY``) moves its value from one to the other (:func:`status_counts`)."""
    return _in(partition, "stats:status")


def status_counts(stored: Mapping[str, str] | Mapping[bytes, bytes]) -> dict[str, int]:
    """Tasks in each status, from a :func:`status_counts_key` hash (its ``{from}>{to}`` fields
    moved from one status to the other); a status that no task ever reached is absent."""
    counts: dict[str, int] = {}
    for raw, value in stored.items():
        name = raw.decode() if isinstance(raw, bytes) else raw
        n = int(value)
        source, moved, target = name.partition(">")
        if moved:
            counts[source] = counts.get(source, 0) - n
            name = target
        counts[name] = counts.get(name, 0) + n
    return counts


def partition_streams(partitions: int, stream: Callable[[int], str]) -> list[str]:
    """One stream (``intake_stream``, ...) of every partition, partition 0 first."""
    return [stream(p) for p in range(partitions)]


coordinators_key: Final = "orga:coordinators"
"""The live coordinators, each scored by its last heartbeat (Redis server time in ms): each
takes a fair share of the partitions, counted from this set."""


def partition_lease_key(partition: int) -> str:
    """The coordinator serving one partition (reading its streams, running its relay):
    ``orga:{p:NN}:partition_lease``."""
    return _in(partition, "partition_lease")


def task_key(task_id: str, partition: int) -> str:
    """The hash holding a task's state: ``orga:{p:NN}:task:{task_id}``."""
    return _in(partition, f"task:{task_id}")


def journal_stream(task_id: str, partition: int) -> str:
    """The journal stream of one task: ``orga:{p:NN}:journal:{task_id}``."""
    return _in(partition, f"journal:{task_id}")


def tokens_stream(task_id: str, partition: int) -> str:
    """The text of a task's model answers as it streams: ``orga:{p:NN}:tokens:{task_id}``."""
    return _in(partition, f"tokens:{task_id}")


def conversation_key(task_id: str, partition: int) -> str:
    """A task's conversation, append-only (rewritten only by a compaction): a list of message
    JSON, ``orga:{p:NN}:conversation:{task_id}``."""
    return _in(partition, f"conversation:{task_id}")


def lease_key(task_id: str, partition: int) -> str:
    """The lease of the coordinator driving a task: ``orga:{p:NN}:lease:{task_id}``."""
    return _in(partition, f"lease:{task_id}")


def journal_sequence_key(task_id: str, partition: int) -> str:
    """The last journal sequence of a task as older versions kept it beside the journal,
    ``orga:{p:NN}:journal_seq:{task_id}``: no longer written (the journal stream's last id,
    ``0-{last+1}``, holds it), named so that the retention purge deletes one left behind."""
    return _in(partition, f"journal_seq:{task_id}")


def idempotency_key(key: str, partition: int) -> str:
    """The task id recorded for an idempotency key, in the key's partition
    (:func:`idempotency_partition`): ``orga:{p:NN}:idem:{key}``."""
    return _in(partition, f"idem:{key}")


def review_claim_key(review_id: str, partition: int) -> str:
    """The one decision sent for a review, in its task's partition (written with the control
    entry by one script): ``orga:{p:NN}:review_claim:{review_id}``."""
    return _in(partition, f"review_claim:{review_id}")


def mcp_tools_key(task_id: str, partition: int) -> str:
    """A task's MCP tool listing (:class:`shared.mcp.McpListing` JSON), written by the tool
    worker that listed it: ``orga:{p:NN}:mcp_tools:{task_id}``."""
    return _in(partition, f"mcp_tools:{task_id}")


def mcp_reply_key(task_id: str, nonce: str, partition: int) -> str:
    """Where a tool worker pushes its answer to one listing request (the reasoning worker
    waits on it): ``orga:{p:NN}:mcp_reply:{task_id}:{nonce}``."""
    return _in(partition, f"mcp_reply:{task_id}:{nonce}")
