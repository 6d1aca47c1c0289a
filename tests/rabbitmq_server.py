"""A private RabbitMQ node for tests, started from Debian's ``rabbitmq-server``.

The node has a name, ports and folders of its own, so it never touches the system's node (if
one runs on the default ports)::

    server = RabbitMQServer()
    server.start()            # waits until the node accepts an AMQP connection
    ...                       # use server.url
    server.restart()          # same name, ports and data: durable queues survive
    server.cleanup()          # stops the node and its epmd, removes its folders

Debian's ``rabbitmq-server`` and ``rabbitmqctl`` are wrappers that, run by root, switch to the
``rabbitmq`` user (with that user's ``HOME``, ``/var/lib/rabbitmq``, so the node and
``rabbitmqctl`` read the same Erlang cookie there), keeping the environment: the node's
``RABBITMQ_*`` variables, and ``ERL_EPMD_PORT`` for an epmd of its own (the system's epmd, on
the default port, is left alone). Its folders belong to ``rabbitmq``; its configuration
replaces ``/etc/rabbitmq``'s (whose listener is the system node's port) and enables no plugin.

``RabbitMQUnavailableError`` says why no node could be started.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import amqp

__all__ = ["RabbitMQServer", "RabbitMQUnavailableError"]

SERVER = "rabbitmq-server"
CTL = "rabbitmqctl"
USER = "rabbitmq"


class RabbitMQUnavailableError(RuntimeError):
    """No private RabbitMQ node could be started (the message says why and what to do)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RabbitMQServer:
    """A RabbitMQ node of its own: ``start``, ``url``, ``ctl``, ``restart``, ``cleanup``."""

    def __init__(self, start_timeout_s: float = 60.0) -> None:
        self.start_timeout_s = start_timeout_s
        self.node = f"orga-test-{os.getpid()}-{_free_port()}@localhost"
        self.port = _free_port()
        self.dist_port = _free_port()
        self.epmd_port = _free_port()
        self.ctl_port = _free_port()
        self.base: Path | None = None
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The AMQP URL of the node (the default ``guest`` user, from the loopback)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> None:
        """Start the node (its folders made on the first start) and wait until it accepts an
        AMQP connection; raise :class:`RabbitMQUnavailableError` saying why it did not."""
        self._check_runnable()
        if self.base is None:
            self.base = self._make_folders()
        output = (self.base / "server.out").open("ab")
        with output:
            self._popen = subprocess.Popen(
                [SERVER], env=self._environment(), stdout=output, stderr=subprocess.STDOUT,
                cwd=self.base, start_new_session=True,
            )  # fmt: skip
        self._wait_until_accepting()

    def ctl(self, *args: str, timeout_s: float = 60.0) -> str:
        """``rabbitmqctl -n NODE ARGS...`` on this node; its output (raises on failure)."""
        done = subprocess.run(
            [CTL, "-n", self.node, *args], env=self._environment(), cwd=self._folder(),
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def stop(self) -> None:
        """Stop the node (``rabbitmqctl stop``; killed if it does not stop in 30 s)."""
        popen, self._popen = self._popen, None
        if popen is None or popen.poll() is not None:
            return
        try:
            self.ctl("stop", timeout_s=30)
            popen.wait(30)
        except (RuntimeError, subprocess.TimeoutExpired):
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)

    def restart(self) -> None:
        """Stop the node and start it again: same name, ports and data."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop the node and its epmd, and remove its folders."""
        self.stop()
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        if Path(epmd).exists():
            subprocess.run(
                [epmd, "-port", str(self.epmd_port), "-kill"], capture_output=True, check=False,
                timeout=10,
            )  # fmt: skip
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def log_tail(self, lines: int = 40) -> str:
        """The end of the node's output and log, for a failure message."""
        if self.base is None:
            return ""
        texts = []
        for path in (self.base / "server.out", *sorted((self.base / "log").glob("*.log"))):
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                texts.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(texts)

    def _check_runnable(self) -> None:
        if shutil.which(SERVER) is None or shutil.which(CTL) is None:
            raise RabbitMQUnavailableError(
                f"{SERVER} is not on the PATH: install Debian's rabbitmq-server "
                "(apt-get install rabbitmq-server; .ci/run does), or set ORGA_TEST_AMQP_URL "
                "to a running node"
            )
        try:
            pwd.getpwnam(USER)
        except KeyError as exc:
            raise RabbitMQUnavailableError(
                f"there is no {USER!r} user, which Debian's rabbitmq-server runs the node as: "
                "reinstall the rabbitmq-server package"
            ) from exc
        if os.geteuid() != 0:
            raise RabbitMQUnavailableError(
                f"Debian's {SERVER} runs the node as the {USER!r} user, which only root can "
                "switch to: run the tests as root, or set ORGA_TEST_AMQP_URL to a running node"
            )

    def _make_folders(self) -> Path:
        """The node's folders under a new one in the system's temp folder (which the
        ``rabbitmq`` user can reach; pytest's are root's only), all belonging to it."""
        base = Path(tempfile.mkdtemp(prefix="orga-rabbitmq-"))
        (base / "mnesia").mkdir()
        (base / "log").mkdir()
        (base / "enabled_plugins").write_text("[].\n")
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            f"distribution.listener.port_range.min = {self.dist_port}\n"
            f"distribution.listener.port_range.max = {self.dist_port}\n"
        )
        (base / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's: its node name
        account = pwd.getpwnam(USER)
        for path in (base, *base.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        base.chmod(0o755)
        return base

    def _folder(self) -> Path:
        assert self.base is not None, "start the node first"
        return self.base

    def _environment(self) -> dict[str, str]:
        base = self._folder()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(self.ctl_port),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(self.ctl_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
        })  # fmt: skip
        return env

    def _wait_until_accepting(self) -> None:
        """Poll an AMQP handshake until it succeeds, the node exits, or the timeout passes."""
        deadline = time.monotonic() + self.start_timeout_s
        error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._popen is not None
            if self._popen.poll() is not None:
                raise RabbitMQUnavailableError(
                    f"{SERVER} exited with {self._popen.returncode}:\n{self.log_tail()}"
                )
            try:
                with amqp.Connection(f"127.0.0.1:{self.port}", connect_timeout=1):
                    return  # connected: the handshake and the login went through
            except (OSError, amqp.exceptions.AMQPError) as exc:
                error = exc
            time.sleep(0.2)
        raise RabbitMQUnavailableError(
            f"{SERVER} did not accept AMQP on port {self.port} within {self.start_timeout_s} s "
            f"({error}):\n{self.log_tail()}"
        )
