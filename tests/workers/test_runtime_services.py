"""The worker process's services: which model a task may reach, and per-task ledgers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ReadOnlyError

from shared import keys
from shared.actions import ToolCallAction
from shared.conversation import Conversation, ConversationMessage
from shared.errors import ConfigError
from shared.inference import InferenceOptions
from shared.loop_types import LoopConfig
from shared.outbox import OutboxEntry
from shared.protocol import ActMode, Fence, ReasonedMessage, ReasonRequest, ToolRequest
from shared.settings import OrgaSettings
from shared.task_spec import ProviderSpec
from tests.fakes.llm_server import FakeOpenAIServer
from workers.handlers import live_fences, onward, run_reasoning, run_tool_calls
from workers.liveness import MARK_DELAY_S
from workers.providers.scripted import ScriptedProvider
from workers.providers.settings import ProviderSettings
from workers.runtime import LEDGERS_KEPT, ProcessServices, local_core
from workers.tasks import _publish

_OPEN: list[ProcessServices] = []


def _services(**settings: object) -> ProcessServices:
    services = ProcessServices(
        OrgaSettings(redis_url="redis://127.0.0.1:1/0", **settings),  # type: ignore[arg-type]
        ProviderSettings(provider="openai", api_key="sk-secret", base_url="https://api.example/v1"),
        "redis://127.0.0.1:1/0",
    )
    _OPEN.append(services)
    return services


@pytest.fixture(autouse=True)
def _close_services() -> Iterator[None]:
    """Each ProcessServices owns an event loop: close them after the test."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _request(provider: ProviderSpec) -> ReasonRequest:
    return ReasonRequest(
        fence=Fence(task_id="t", step_id="s", iteration=0, attempt=1),
        agent_id="a",
        conversation=Conversation(),
        config=LoopConfig(),
        provider=provider,
        workspace="/tmp/ws",
    )


def test_a_task_cannot_send_the_key_to_its_own_base_url() -> None:
    """provider.base_url other than ORGA_BASE_URL is refused unless the operator allows it."""
    services = _services()
    with pytest.raises(ConfigError, match="ORGA_ALLOW_TASK_BASE_URL"):
        services.provider(_request(ProviderSpec(base_url="https://attacker.example/v1")))
    allowed = _services(allow_task_base_url=True)
    provider = allowed.provider(_request(ProviderSpec(base_url="https://own.example/v1")))
    assert provider.provider_name() == "openai"


def _keyed(**keys: str) -> ProcessServices:
    """A worker configured for openai at api.example with ORGA_API_KEY, plus ``keys``."""
    services = ProcessServices(
        OrgaSettings(redis_url="redis://127.0.0.1:1/0"),
        ProviderSettings(
            provider="openai", api_key="sk-orga", base_url="https://api.example/v1", **keys
        ),  # type: ignore[arg-type]
        "redis://127.0.0.1:1/0",
    )
    _OPEN.append(services)
    return services


def _sent(provider: object) -> tuple[str, str | None]:
    """Where a provider sends its requests and the key it sends (read from its endpoint)."""
    endpoint = provider._endpoint  # type: ignore[attr-defined]
    key = endpoint.api_key.get_secret_value() if endpoint.api_key is not None else None
    return endpoint.base_url, key


@pytest.mark.parametrize("kind", ["anthropic", "openrouter"])
def test_a_task_switching_provider_never_gets_orga_api_key(kind: str) -> None:
    """ORGA_API_KEY is bound to ORGA_PROVIDER: a task naming another provider is refused,
    saying which variable would allow it, and the key appears nowhere in the message."""
    services = _keyed()
    with pytest.raises(ConfigError, match=f"switches provider.kind to '{kind}'") as caught:
        services.provider(_request(ProviderSpec(kind=kind)))  # type: ignore[arg-type]
    assert f"set {kind.upper()}_API_KEY on the workers" in str(caught.value)
    assert "sk-orga" not in str(caught.value)


def test_a_switched_provider_gets_its_own_key_at_its_own_default_url() -> None:
    """With ANTHROPIC_API_KEY set, a task naming anthropic sends that key to Anthropic's
    default URL, not ORGA_API_KEY and not ORGA_BASE_URL (which belong to openai here)."""
    services = _keyed(anthropic_api_key="sk-ant")
    provider = services.provider(_request(ProviderSpec(kind="anthropic")))
    assert provider.provider_name() == "anthropic"
    assert _sent(provider) == ("https://api.anthropic.com/v1", "sk-ant")


def test_the_configured_provider_keeps_its_key_and_url() -> None:
    """A task that names the deployment's own provider (or none) gets ORGA_API_KEY at
    ORGA_BASE_URL, as before."""
    services = _keyed()
    for spec in (ProviderSpec(), ProviderSpec(kind="openai")):
        assert _sent(services.provider(_request(spec))) == ("https://api.example/v1", "sk-orga")


def test_a_switched_provider_at_a_task_url_needs_the_operators_consent() -> None:
    """Another provider at the task's own URL is refused without ORGA_ALLOW_TASK_BASE_URL; with
    it, that provider's own key goes there, never ORGA_API_KEY."""
    services = _keyed(anthropic_api_key="sk-ant")
    spec = ProviderSpec(kind="anthropic", base_url="https://proxy.example")
    with pytest.raises(ConfigError, match="ORGA_ALLOW_TASK_BASE_URL"):
        services.provider(_request(spec))
    allowed = ProcessServices(
        OrgaSettings(redis_url="redis://127.0.0.1:1/0", allow_task_base_url=True),
        services.provider_settings,
        "redis://127.0.0.1:1/0",
    )
    _OPEN.append(allowed)
    assert _sent(allowed.provider(_request(spec))) == ("https://proxy.example", "sk-ant")


def test_scripted_replies_resume_where_the_task_left_off() -> None:
    """A fresh scripted provider per call answers the reply the task's call count points at."""
    services = _services()
    request = _request(ProviderSpec(kind="scripted", replies=["one", "two", "three"]))
    provider = services.provider(request.model_copy(update={"model_calls": 2}))
    assert isinstance(provider, ScriptedProvider)
    assert provider.remaining == 1


def test_ledgers_are_per_task_and_bounded() -> None:
    """LlmRecovery counts are kept per task, for a bounded number of tasks."""
    services = _services()
    first = services._ledger("t1")
    first.count_llm_attempt("tool")
    assert services._ledger("t2").llm_attempts("tool") == 0
    assert services._ledger("t1").llm_attempts("tool") == 1
    for index in range(LEDGERS_KEPT + 5):
        services._ledger(f"x{index}")
    assert services._ledger("t1").llm_attempts("tool") == 0


def test_chained_calls_go_out_with_the_reasoned_message(redis_url: str, redis_client: Any) -> None:
    """With ActMode.CHAIN the worker sends up to max_concurrent_tools approved calls to the
    outbox (for the tool queue) itself, in the transaction that publishes the ``reasoned``
    message listing them."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    reply = {
        "tool_calls": [
            {"name": "file_read", "arguments": {"path": "a.py"}},
            {"name": "file_read", "arguments": {"path": "b.py"}},
        ]
    }
    request = _request(ProviderSpec(kind="scripted", replies=[reply])).model_copy(
        update={"act": ActMode.CHAIN, "config": LoopConfig(max_concurrent_tools=1)}
    )
    message = services.run(run_reasoning(request, services))
    assert len(message.approved_calls) == 2
    assert message.chained == [message.approved_calls[0].call_id]
    observation, calls = onward(request, message)
    assert observation is message
    assert [r.fence for r in calls] == [
        request.fence.acting().for_call(message.approved_calls[0].call_id)
    ]
    services.run(services.publish(observation, calls))

    with redis.Redis.from_url(redis_url) as client:
        assert client.xlen(keys.observations_stream(0)) == 1
        assert client.llen(keys.tools_queue) == 0  # a coordinator's relay sends it
        ((entry_id, fields),) = client.xrange(keys.outbox_stream(0))
    entry = OutboxEntry.from_fields(entry_id.decode(), fields)
    assert (entry.task, entry.queue) == (keys.tool_task_name, keys.tools_queue)
    assert ToolRequest.model_validate_json(entry.payload) == calls[0]


def test_a_lone_call_carries_its_reasoning_to_the_tool_worker(
    redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    """One approved call: no ``reasoned`` message of its own; the tool worker answers for the
    iteration with the reasoning and the call's outcome in ``acted``."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    (tmp_path / "a.py").write_text("print('a')\n")
    reply = {"tool_calls": [{"name": "file_read", "arguments": {"path": "a.py"}}]}
    request = _request(ProviderSpec(kind="scripted", replies=[reply])).model_copy(
        update={"act": ActMode.CHAIN, "workspace": str(tmp_path)}
    )
    message = services.run(run_reasoning(request, services))
    observation, calls = onward(request, message)
    assert observation is None
    (call,) = calls
    assert call.completes == message

    answer = services.run(run_tool_calls(call, services))
    assert isinstance(answer, ReasonedMessage)
    assert answer.fence == request.fence and answer.chained == []
    assert answer.new_messages == message.new_messages
    (acted,) = answer.acted or []
    assert acted.fence == call.fence
    assert "print('a')" in acted.observation.content


def test_the_answer_mark_says_whether_the_answer_went_out_in_its_chained_call(
    redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    """A reasoning that chains its lone call marks its dispatch answered at once, its answer
    inside that call: the mark says "chained" (the coordinator then waits for the tools
    queue). The tool worker that runs the call publishes the iteration's observation and
    marks both fences answered "direct", later. A reasoning that publishes its ``reasoned``
    message marks it "direct" (its answer is on the observations stream)."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    (tmp_path / "a.py").write_text("print('a')\n")
    reply = {"tool_calls": [{"name": "file_read", "arguments": {"path": "a.py"}}]}
    request = _request(ProviderSpec(kind="scripted", replies=[reply])).model_copy(
        update={"act": ActMode.CHAIN, "workspace": str(tmp_path)}
    )
    reasoning = request.fence.liveness_id()

    def marks(liveness_id: str) -> dict[str, float | None]:
        with redis.Redis.from_url(redis_url) as client:
            names = [keys.answered_via_member(liveness_id, v) for v in keys.ANSWERED_VIAS]
            scores = client.zmscore(keys.heartbeats_key, names)
            return dict(zip(keys.ANSWERED_VIAS, scores, strict=True))

    message = services.run(run_reasoning(request, services))
    observation, calls = onward(request, message)
    assert observation is None
    services.run(services.publish(observation, calls, answered=live_fences(request)))
    chained = marks(reasoning)
    assert chained[keys.ANSWERED_DIRECT] is None
    answered_at = chained[keys.ANSWERED_CHAINED]
    assert answered_at is not None and answered_at < 0
    with redis.Redis.from_url(redis_url) as client:
        assert client.zscore(keys.heartbeats_key, reasoning) == answered_at

    (call,) = calls
    answer = services.run(run_tool_calls(call, services))
    services.run(services.publish(answer, (), answered=live_fences(call)))
    assert marks(reasoning)[keys.ANSWERED_DIRECT] is None, "a direct mark waits for a write"
    _wait_for_marks(services)
    after = marks(reasoning)
    assert after[keys.ANSWERED_CHAINED] == answered_at
    assert after[keys.ANSWERED_DIRECT] is not None and after[keys.ANSWERED_DIRECT] <= answered_at
    # a tool call's own fence is not marked (the coordinator reads a reasoning's marks only)
    assert marks(call.fence.liveness_id()) == dict.fromkeys(keys.ANSWERED_VIAS)
    with redis.Redis.from_url(redis_url) as client:
        assert (client.zscore(keys.heartbeats_key, call.fence.liveness_id()) or 0) < 0

    # a reasoning that chains one of two calls answers on the stream: "direct" only
    two = {"tool_calls": [{"name": "file_read", "arguments": {"path": p}} for p in "ab"]}
    plain = _request(ProviderSpec(kind="scripted", replies=[two])).model_copy(
        update={"act": ActMode.CHAIN, "config": LoopConfig(max_concurrent_tools=1)}
    )
    plain = plain.model_copy(update={"fence": plain.fence.model_copy(update={"nonce": "n2"})})
    said = services.run(run_reasoning(plain, services))
    observation, calls = onward(plain, said)
    assert observation is not None and len(calls) == 1
    services.run(services.publish(observation, calls, answered=live_fences(plain)))
    _wait_for_marks(services)
    direct = marks(plain.fence.liveness_id())
    assert direct[keys.ANSWERED_CHAINED] is None and direct[keys.ANSWERED_DIRECT] is not None


def test_a_script_file_is_parsed_again_only_when_it_changes(tmp_path: Path) -> None:
    """Each reasoning call builds a provider; the file's script is kept until the file changes."""
    services = _services()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["one", "two"]))
    request = _request(ProviderSpec(kind="scripted", script=str(script)))
    first = services.provider(request)
    assert isinstance(first, ScriptedProvider) and first.remaining == 2
    assert services._script_file(script) is services._script_file(script)

    script.write_text(json.dumps(["one", "two", "three"]))
    stat = script.stat()
    os.utime(script, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    again = services.provider(request.model_copy(update={"model_calls": 1}))
    assert isinstance(again, ScriptedProvider) and again.remaining == 2


def test_a_worker_reads_only_the_messages_it_lacks(redis_url: str, redis_client: Any) -> None:
    """By reference: the first read takes the whole list, the next only the new tail; another
    epoch, or a task id reused by a newer task, is read again from the start, and a list
    shorter than the reference is refused."""
    from shared.conversation import ConversationMessage
    from shared.protocol import ConversationRef
    from workers.runtime import StaleConversationError

    plain = redis.Redis.from_url(redis_url)
    key = keys.conversation_key("t", 0)
    plain.rpush(key, *[ConversationMessage.user(f"m{i}").model_dump_json() for i in range(3)])
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)

    def read(length: int, epoch: int = 1, created_at: float = 1.0) -> list[str]:
        ref = ConversationRef(length=length, epoch=epoch, created_at=created_at)
        request = _request(ProviderSpec()).model_copy(update={"conversation_ref": ref})
        return [m.content for m in services.run(services.conversation(request)).messages]

    assert read(3) == ["m0", "m1", "m2"]
    plain.rpush(key, ConversationMessage.user("m3").model_dump_json())
    plain.lset(key, 0, ConversationMessage.user("changed").model_dump_json())
    assert read(4) == ["m0", "m1", "m2", "m3"]  # the cached prefix, plus the tail it lacked
    assert read(4, epoch=2) == ["changed", "m1", "m2", "m3"]  # a new epoch: read again
    plain.lset(key, 1, ConversationMessage.user("reused").model_dump_json())
    # The same id and epoch, but another task (created again after a purge): read again.
    assert read(4, epoch=2, created_at=2.0) == ["changed", "reused", "m2", "m3"]
    with pytest.raises(StaleConversationError, match="expects 9"):
        read(9, epoch=3)
    plain.close()


def test_a_request_carrying_its_tail_is_read_only_before_it(
    redis_url: str, redis_client: Any
) -> None:
    """A request that carries the tail of its conversation: a process that read the task up
    to the tail's start reads nothing from Redis (the list may even be gone), one that read
    less reads only the messages before the tail, and the tail comes from the request."""
    from shared.conversation import ConversationMessage
    from shared.protocol import ConversationRef

    plain = redis.Redis.from_url(redis_url)
    key = keys.conversation_key("t", 0)
    stored = [ConversationMessage.user(f"m{i}") for i in range(6)]
    plain.rpush(key, *[m.model_dump_json() for m in stored[:4]])
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)

    def read(length: int, tail: list[ConversationMessage], start: bool = False) -> list[str]:
        ref = ConversationRef(length=length, epoch=1, created_at=1.0, tail=tail)
        request = _request(ProviderSpec()).model_copy(update={"conversation_ref": ref})

        async def both() -> list[str]:
            if start:
                await services.started(request, [request.fence], keys.reasoning_queue)
                services.liveness.finished([request.fence])
            return [m.content for m in (await services.conversation(request)).messages]

        return services.run(both())

    # Read m0..m1 from Redis, m2..m3 from the request (Redis's m2, m3 are not read).
    plain.lset(key, 2, ConversationMessage.user("not read").model_dump_json())
    assert read(4, stored[2:4]) == ["m0", "m1", "m2", "m3"]
    plain.delete(key)  # what this process holds reaches the next tail: nothing to read
    assert read(6, stored[4:6], start=True) == ["m0", "m1", "m2", "m3", "m4", "m5"]
    assert read(6, stored[3:6]) == ["m0", "m1", "m2", "m3", "m4", "m5"]
    plain.close()


def _write(
    tmp_path: Path, content: str, *, iteration: int, attempt: int, nonce: str
) -> ToolRequest:
    fence = Fence(
        task_id="t", step_id="s", iteration=iteration, attempt=attempt, nonce=nonce, call_id="c1"
    )
    arguments = json.dumps({"path": "notes.txt", "content": content})
    return ToolRequest(
        fence=fence,
        agent_id="a",
        action=ToolCallAction(call_id="c1", name="file_write", arguments=arguments),
        workspace=str(tmp_path),
        config=LoopConfig(),
    )


def test_a_write_delivered_again_after_the_task_moved_on_changes_nothing(
    redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    """A file_write re-delivered (a new attempt and nonce: a re-dispatch) after a later
    iteration rewrote the file is answered with its first result, marked replayed, and the
    file keeps the later content; another call under the same id with other content runs."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    first = _write(tmp_path, "v1", iteration=1, attempt=3, nonce="aaa")
    services.run(run_tool_calls(first, services))
    services.run(
        run_tool_calls(_write(tmp_path, "v2", iteration=2, attempt=4, nonce="bbb"), services)
    )
    again = first.model_copy(
        update={"fence": first.fence.model_copy(update={"attempt": 5, "nonce": "ccc"})}
    )
    (replayed,) = services.run(run_tool_calls(again, services))
    assert (tmp_path / "notes.txt").read_text() == "v2"
    assert replayed.observation.metadata["replayed"] == "true"
    assert not replayed.observation.is_error
    other = _write(tmp_path, "v3", iteration=1, attempt=6, nonce="ddd")
    (ran,) = services.run(run_tool_calls(other, services))
    assert "replayed" not in ran.observation.metadata
    assert (tmp_path / "notes.txt").read_text() == "v3"
    with redis.Redis.from_url(redis_url) as client:
        stored = list(client.scan_iter(f"{keys.applied_call_key_prefix}*"))
        assert len(stored) == 3
        assert 0 < client.ttl(stored[0]) <= keys.applied_call_ttl_s


def test_a_dispatch_start_reads_the_conversation_and_the_hold_in_its_round_trip(
    redis_url: str, redis_client: Any
) -> None:
    """`started` writes the heartbeat and, in the same pipeline, reads the messages this
    process lacks and the provider's rate-limit hold: the conversation then needs no read, and
    the model call's first wait uses the hold read then."""
    from shared.conversation import ConversationMessage
    from shared.protocol import ConversationRef
    from workers.providers.rate_limit import RedisThrottle, key_digest

    plain = redis.Redis.from_url(redis_url)
    key = keys.conversation_key("t", 0)
    plain.rpush(key, *[ConversationMessage.user(f"m{i}").model_dump_json() for i in range(2)])
    provider = ProviderSettings(provider="openai", api_key="sk-x", base_url="http://m.test/v1")
    services = ProcessServices(OrgaSettings(redis_url=redis_url), provider, redis_url)
    _OPEN.append(services)
    hold = keys.provider_limit_key("openai", key_digest("http://m.test/v1", "sk-x"))
    ref = ConversationRef(length=2, epoch=1, created_at=1.0)
    request = _request(ProviderSpec()).model_copy(update={"conversation_ref": ref})

    async def start_then_read() -> tuple[list[str], float]:
        await services.started(request, [request.fence], keys.reasoning_queue)
        plain.delete(key)  # read already: no second read
        plain.set(hold, "9999999999999")  # read already (absent): not read again
        messages = (await services.conversation(request)).messages
        blocked_s = await RedisThrottle(services.redis, hold).blocked_for_s()
        services.liveness.finished([request.fence])
        return [m.content for m in messages], blocked_s

    contents, blocked_s = services.run(start_then_read())
    assert contents == ["m0", "m1"]
    assert blocked_s == 0.0
    assert plain.zscore(keys.heartbeats_key, request.fence.liveness_id()) is not None
    plain.close()


def test_starts_and_breaker_checks_of_one_loop_turn_share_one_pipeline(
    redis_url: str, redis_client: Any
) -> None:
    """Concurrent calls' starts and their tools' breaker checks go out in one pipeline each
    loop turn, and each start still writes its own heartbeat."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    requests = [
        _request(ProviderSpec(replies=[])).model_copy(
            update={"fence": Fence(task_id=f"t{i}", step_id="s", iteration=0, attempt=1)}
        )
        for i in range(8)
    ]
    breakers = services.executor.breakers

    async def start_and_check(request: ReasonRequest) -> None:
        await services.started(request, [request.fence], keys.reasoning_queue)
        await breakers.breaker("file_read", request.fence.task_id).check()
        services.liveness.finished([request.fence])

    async def all_calls() -> int:
        await asyncio.gather(*(start_and_check(r) for r in requests))
        return services.pipelines.batches_sent

    assert services.run(all_calls()) == 2  # the starts, then the checks
    with redis.Redis.from_url(redis_url) as plain:
        beats = plain.zrange(keys.heartbeats_key, 0, -1)
        assert len(beats) == len(requests)
        # a breaker closed with no failure is kept as none: the checks wrote nothing
        assert not plain.exists(keys.breaker_key("file_read:task:t3"))


def test_a_start_that_fails_or_is_cancelled_stops_heartbeating(
    redis_url: str, redis_client: Any
) -> None:
    """A dispatch whose start raised never runs, so this process no longer heartbeats it."""
    services = _services()  # a Redis nobody listens on: the start raises ConnectionError
    request = _request(ProviderSpec(replies=[]))

    async def failed_start() -> int:
        with pytest.raises(redis.ConnectionError):
            await services.started(request, [request.fence], keys.reasoning_queue)
        return services.liveness.running

    assert services.run(failed_start()) == 0

    live = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(live)

    async def cancelled_start() -> int:
        start = asyncio.ensure_future(live.started(request, [request.fence], keys.reasoning_queue))
        await asyncio.sleep(0)
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        return live.liveness.running

    assert live.run(cancelled_start()) == 0


def test_the_mcp_reaper_reads_which_tasks_are_active(redis_url: str, redis_client: Any) -> None:
    """A worker process's MCP sessions keep idle connections of the tasks in the partitions'
    deadline indexes, which hold every active task (a task awaiting a reviewer is there), and
    close those of the others."""
    services = ProcessServices(
        OrgaSettings(redis_url=redis_url, partitions=2), ProviderSettings(), redis_url
    )
    _OPEN.append(services)
    assert services.mcp.active_tasks is not None
    tasks = ["t-held", "t-ended", "t-other"]
    with redis.Redis.from_url(redis_url) as client:
        for task_id in ("t-held", "t-other"):
            client.zadd(keys.deadlines_key(services._partition(task_id)), {task_id: 1e12})
    assert services.run(services.mcp.active_tasks(tasks)) == {"t-held", "t-other"}


def test_on_a_cluster_a_refused_answer_mark_never_sends_the_observation_twice(
    redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster the observation and chained calls are one transaction; the answer's marks
    go later in a write of their own. That write refused once (ReadOnlyError, a transient
    write error): the committed transaction is not sent again (one observation, one outbox
    entry), and the marks are written at the next try."""
    settings = OrgaSettings(redis_url=redis_url, redis_cluster=True)
    services = ProcessServices(settings, ProviderSettings(), redis_url)
    _OPEN.append(services)
    reply = {"tool_calls": [{"name": "file_read", "arguments": {"path": p}} for p in "ab"]}
    request = _request(ProviderSpec(kind="scripted", replies=[reply])).model_copy(
        update={"act": ActMode.CHAIN, "config": LoopConfig(max_concurrent_tools=1)}
    )
    message = services.run(run_reasoning(request, services))
    observation, calls = onward(request, message)
    assert observation is message and len(calls) == 1
    refusals: list[str] = []
    zadd = services.redis.zadd

    async def refusing_once(*args: Any, **kwargs: Any) -> Any:
        if not refusals:
            refusals.append("marks")
            raise ReadOnlyError("You can't write against a read only replica.")
        return await zadd(*args, **kwargs)

    monkeypatch.setattr(services.redis, "zadd", refusing_once)
    services.run(_publish(services, observation, calls, [request.fence]))
    _wait_for_marks(services, tries=2)

    assert refusals == ["marks"]
    with redis.Redis.from_url(redis_url) as client:
        assert client.xlen(keys.observations_stream(0)) == 1
        assert client.xlen(keys.outbox_stream(0)) == 1
        assert (client.zscore(keys.heartbeats_key, request.fence.liveness_id()) or 0) < 0


def _wait_for_marks(services: ProcessServices, tries: int = 1) -> None:
    """Wait for ``tries`` of the answer marks' own write (:data:`MARK_DELAY_S` each)."""
    services.run(asyncio.sleep(tries * MARK_DELAY_S + 0.3))


def test_a_core_serves_model_calls_from_one_session_on_each_loop() -> None:
    """A provider built before any loop runs makes its calls on the core's one session; the
    same core used again under a new loop (the in-process driver run twice) gets a new one."""
    with FakeOpenAIServer(api_key="sk-secret") as server:
        core = local_core(
            provider_settings=ProviderSettings(
                provider="openai",  # type: ignore[arg-type]
                api_key="sk-secret",  # type: ignore[arg-type]
                base_url=server.base_url,
            )
        )
        provider = core.provider(_request(ProviderSpec()))
        sessions: list[object] = []

        async def two_calls(close: bool) -> list[str]:
            conversation = Conversation(messages=[ConversationMessage.user("hi")])
            answers = []
            for _ in range(2):
                server.respond_text("hello")
                answers.append((await provider.complete(conversation, InferenceOptions())).content)
                sessions.append(core.http_session())
            if close:
                await core.aclose()
            return answers

        assert asyncio.run(two_calls(close=False)) == ["hello", "hello"]
        assert asyncio.run(two_calls(close=True)) == ["hello", "hello"]
        assert sessions[0] is sessions[1]
        assert sessions[2] is sessions[3] and sessions[2] is not sessions[0]
        assert len(server.requests) == 4
    assert not server.errors, server.errors


def test_a_task_base_url_that_cannot_be_used_is_named_as_such() -> None:
    """A task's provider.base_url aiohttp cannot use (port 99999) is a ConfigError naming the
    URL, for a task that switched provider too (not "no key is set": the key is)."""
    services = ProcessServices(
        OrgaSettings(redis_url="redis://127.0.0.1:1/0", allow_task_base_url=True),
        ProviderSettings(
            provider="openai",
            api_key="sk-orga",
            base_url="https://api.example/v1",
            anthropic_api_key="sk-ant",
        ),  # type: ignore[arg-type]
        "redis://127.0.0.1:1/0",
    )
    _OPEN.append(services)
    for kind in ("openai", "anthropic"):
        spec = ProviderSpec(kind=kind, base_url="http://llm.test:99999/v1")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"llm\.test:99999") as caught:
            services.provider(_request(spec))
        assert "is not a valid URL" in str(caught.value), kind


def _commands(client: redis.Redis, *names: str) -> dict[str, int]:
    """How many times Redis ran each of ``names`` since its stats were reset."""
    stats = client.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names}


def test_a_start_reads_the_rate_limit_hold_at_most_once_per_fresh_window(
    redis_url: str, redis_client: Any
) -> None:
    """A dispatch that starts within HOLD_FRESH_S of the last read of its hold takes that read
    (no GET); after it, the hold is read again; a hold this process sets is read at the next
    start."""
    from workers.providers.rate_limit import HoldReads, RedisThrottle, key_digest

    provider = ProviderSettings(provider="openai", api_key="sk-x", base_url="http://m.test/v1")
    services = ProcessServices(OrgaSettings(redis_url=redis_url), provider, redis_url)
    _OPEN.append(services)
    now = [100.0]
    services._hold_reads = HoldReads(fresh_s=0.1, clock=lambda: now[0])
    hold = keys.provider_limit_key("openai", key_digest("http://m.test/v1", "sk-x"))
    request = _request(ProviderSpec())
    plain = redis.Redis.from_url(redis_url)

    async def start_and_wait() -> float:
        await services.started(request, [request.fence], keys.reasoning_queue)
        services.liveness.finished([request.fence])
        throttle = services.throttle("openai", key_digest("http://m.test/v1", "sk-x"))
        return await throttle.blocked_for_s()

    plain.config_resetstat()
    assert services.run(start_and_wait()) == 0.0
    assert _commands(plain, "get")["get"] == 1
    plain.set(hold, str(int((time.time() + 60) * 1000)))  # another process's 429
    now[0] += 0.05
    assert services.run(start_and_wait()) == 0.0, "within the window: the last read stands"
    assert _commands(plain, "get")["get"] == 1
    now[0] += 0.1
    assert services.run(start_and_wait()) > 50, "past the window: read again"
    assert _commands(plain, "get")["get"] == 2

    plain.delete(hold)
    now[0] += 0.2
    assert services.run(start_and_wait()) == 0.0
    assert _commands(plain, "get")["get"] == 3

    async def block() -> None:
        await RedisThrottle(services.redis, hold, reads=services._hold_reads).block(30)

    services.run(block())  # this process's own 429 (its script GETs the hold once) ...
    assert _commands(plain, "get")["get"] == 4
    assert services.run(start_and_wait()) > 25  # ... and the next start reads it at once
    assert _commands(plain, "get")["get"] == 5
    plain.close()


def test_a_single_answer_goes_out_without_multi(redis_url: str, redis_client: Any) -> None:
    """One observation (or one chained call) is one write, atomic on its own: no MULTI/EXEC.
    The observation's mark waits for the next heartbeat write: a start's ``ZADD`` carries it
    (no command of its own), or its own ``ZADD`` within MARK_DELAY_S. An observation with a
    chained call is two writes: one transaction, all or nothing, as before."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    plain = redis.Redis.from_url(redis_url)
    reply = {"tool_calls": [{"name": "file_read", "arguments": {"path": p}} for p in "ab"]}
    request = _request(ProviderSpec(kind="scripted", replies=["done"]))
    message = services.run(run_reasoning(request, services))

    plain.config_resetstat()
    services.run(services.publish(message, (), answered=live_fences(request)))
    assert _commands(plain, "multi", "exec", "xadd", "zadd") == {
        "multi": 0,
        "exec": 0,
        "xadd": 1,
        "zadd": 0,
    }
    assert plain.xlen(keys.observations_stream(0)) == 1
    assert plain.zscore(keys.heartbeats_key, request.fence.liveness_id()) is None
    _wait_for_marks(services)
    assert _commands(plain, "zadd") == {"zadd": 1}
    assert (plain.zscore(keys.heartbeats_key, request.fence.liveness_id()) or 0) < 0

    # the next start carries the marks waiting: one ZADD for both
    later = _request(ProviderSpec(kind="scripted", replies=["done"]))
    later = later.model_copy(update={"fence": later.fence.model_copy(update={"nonce": "n3"})})
    services.run(services.publish(message.model_copy(update={"fence": later.fence}), (),
                                  answered=live_fences(later)))  # fmt: skip
    started = _request(ProviderSpec(kind="scripted", replies=["done"]))
    started = started.model_copy(  # its look near: the start is one ZADD, the heartbeat
        update={
            "fence": started.fence.model_copy(update={"nonce": "n4"}),
            "look_at": time.time() + 20,
        }
    )
    plain.config_resetstat()
    services.run(services.started(started, [started.fence], keys.reasoning_queue))
    services.liveness.finished([started.fence])
    assert _commands(plain, "zadd") == {"zadd": 1}
    assert (plain.zscore(keys.heartbeats_key, later.fence.liveness_id()) or 0) < 0
    assert (plain.zscore(keys.heartbeats_key, started.fence.liveness_id()) or 0) > 0
    _wait_for_marks(services)
    assert _commands(plain, "zadd") == {"zadd": 1}, "nothing left for a write of its own"

    chaining = _request(ProviderSpec(kind="scripted", replies=[reply])).model_copy(
        update={"act": ActMode.CHAIN, "config": LoopConfig(max_concurrent_tools=1)}
    )
    chaining = chaining.model_copy(
        update={"fence": chaining.fence.model_copy(update={"nonce": "n2"})}
    )
    said = services.run(run_reasoning(chaining, services))
    observation, calls = onward(chaining, said)
    assert observation is not None and len(calls) == 1
    plain.config_resetstat()
    services.run(services.publish(observation, calls, answered=live_fences(chaining)))
    assert _commands(plain, "multi", "exec", "xadd") == {"multi": 1, "exec": 1, "xadd": 2}
    plain.close()


def test_a_refused_single_write_is_raised(redis_url: str, redis_client: Any) -> None:
    """The single write's error reply is raised (the task's publish tries again); nothing
    else is."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    plain = redis.Redis.from_url(redis_url)
    request = _request(ProviderSpec(kind="scripted", replies=["done"]))
    message = services.run(run_reasoning(request, services))
    plain.set(keys.observations_stream(0), "not a stream")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        services.run(services.publish(message, (), answered=live_fences(request)))
    plain.delete(keys.observations_stream(0))
    services.run(services.publish(message, (), answered=live_fences(request)))
    assert plain.xlen(keys.observations_stream(0)) == 1
    plain.close()


def test_requests_built_without_validation_equal_validated_ones() -> None:
    """A chained call's ToolRequest and the gate's context are built with ``model_construct``
    (their values come from a validated request): each equals the model validated from its
    own dump, and round-trips through JSON as the wire needs."""
    from workers.handlers import _gate_context

    request = _request(ProviderSpec()).model_copy(
        update={"allowed_tools": ["file_read"], "workspace_template": "/tmp/tpl"}
    )
    call = ToolCallAction(call_id="c1", name="file_read", arguments='{"path": "a"}')
    built = request.tool_request(call)
    assert built == ToolRequest.model_validate(built.model_dump())
    assert ToolRequest.model_validate_json(built.model_dump_json()) == built
    assert built.answer.kind == "each" and built.edited_by is None
    context = _gate_context(request, 3)
    from workers.gates.base import GateContext

    assert context == GateContext.model_validate(context.model_dump())
    assert context.allowed_tools == frozenset({"file_read"}) and context.attributes == {}


def test_the_starts_of_one_loop_turn_are_one_zadd_written_before_each_call_runs(
    redis_url: str, redis_client: Any
) -> None:
    """Concurrent starts share one ``ZADD`` of ``orga:heartbeats`` (with the answer marks
    waiting): each start returns only once its heartbeat is in Redis, and a start whose look
    is far still brings its task's look forward in the same round trip."""
    services = ProcessServices(OrgaSettings(redis_url=redis_url), ProviderSettings(), redis_url)
    _OPEN.append(services)
    now = time.time()
    requests = [
        _request(ProviderSpec(replies=[])).model_copy(
            update={
                "fence": Fence(task_id=f"t{i}", step_id="s", iteration=0, attempt=1),
                "look_at": now + 20 if i < 6 else now + 600,  # the last two: a far look
            }
        )
        for i in range(8)
    ]
    answered = Fence(task_id="done", step_id="s", iteration=0, attempt=1)
    plain = redis.Redis.from_url(redis_url)
    for request in requests[6:]:
        task_id = request.fence.task_id
        plain.zadd(keys.deadlines_key(keys.partition_of(task_id, 1)), {task_id: now + 600})
    seen: list[float | None] = []

    async def start(request: ReasonRequest) -> None:
        await services.started(request, [request.fence], keys.reasoning_queue)
        seen.append(await services.redis.zscore(keys.heartbeats_key, request.fence.liveness_id()))
        services.liveness.finished([request.fence])

    async def all_starts() -> None:
        services.liveness.answered_later([answered])
        await services.redis.config_resetstat()
        await asyncio.gather(*(start(r) for r in requests))

    services.run(all_starts())
    assert len(seen) == len(requests) and all(s is not None and s > 0 for s in seen)
    stats = plain.info("commandstats")
    assert stats["cmdstat_zadd"]["calls"] == 1 + 2  # the starts and the mark; two pulls
    assert (plain.zscore(keys.heartbeats_key, answered.liveness_id()) or 0) < 0
    for request in requests[6:]:
        task_id = request.fence.task_id
        look = plain.zscore(keys.deadlines_key(keys.partition_of(task_id, 1)), task_id)
        assert look is not None and look < now + 60  # brought to one timeout from the start
    plain.close()
