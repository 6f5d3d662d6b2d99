"""The Spark side of an hvlite job: the tasks (one per slot) and the driver's register of them.

Contract:
  * :func:`task_main` is what each Spark task runs (in barrier mode for ``run``, as plain tasks
    for ``run_elastic``): it starts a node agent (``hvlite/cluster/agent.py``) on the address
    its executor reaches the driver from, hands it the job, registers with the driver
    (:class:`Register`) and waits. The driver answers with the setup of the task's rank
    process (variables, ``CUDA_VISIBLE_DEVICES``), which the task confirms; the task ends when
    the driver closes the registration (the job is over) or goes away, closing its agent
    (which ends whatever still runs below it). A task is one slot; the tasks of one executor
    are one hvlrun host (``spark-<address>-<executor>``).
  * :class:`Register` is the driver's server: it accepts authenticated registrations, keeps
    each live task (index, attempt, address, agent, executor, GPU addresses), and calls
    ``on_change`` when a task registers or its connection closes (an executor or node lost:
    the kernel closes a dead process's connections at once). :meth:`Register.setup` sends a
    task its setup and waits for the confirmation. :meth:`Register.close` ends every task.
"""
import json
import os
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from ..cluster.agent import Agent, local_address
from ..cluster.frames import Channel, ChannelError, connect

__all__ = ["Task", "Register", "task_main"]


def task_main(index: int, key: str, register: str, payload: bytes) -> List[int]:
    """One Spark task's life (see the module contract); returns ``[index]``."""
    from pyspark import TaskContext
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    gpus = []
    if context is not None and "gpu" in context.resources():
        gpus = list(context.resources()["gpu"].addresses)
    host = register.rpartition(":")[0]
    agent = Agent(key, local_address(host))
    channel = None
    try:
        agent.set_job(payload)
        channel = connect(register, key)
        channel.send("register", json.dumps({
            "index": index, "attempt": attempt, "address": agent.address.rpartition(":")[0],
            "agent": agent.address, "executor": "%x" % os.getppid(), "gpus": gpus}).encode())
        while True:
            kind, data = channel.recv()
            if kind == "setup":
                setup = json.loads(data.decode("utf-8"))
                agent.set_setup(setup.get("env", {}), os.getcwd(), [p for p in sys.path if p])
                channel.send("ready")
    except ChannelError:
        pass                      # the driver closed the registration: the job is over
    finally:
        if channel is not None:
            channel.close()
        agent.close()
    return [index]


class Task:
    """A registered task, as the driver sees it."""

    def __init__(self, channel: Channel, info: dict) -> None:
        self.channel = channel
        self.index, self.attempt = int(info["index"]), int(info.get("attempt", 0))
        self.address, self.agent = str(info["address"]), str(info["agent"])
        self.executor = str(info.get("executor", ""))
        self.gpus = [str(g) for g in info.get("gpus", [])]
        self.ready = threading.Event()
        self.alive = True


class Register:
    """The driver's register of tasks (see the module contract)."""

    def __init__(self, key: str, bind: str, on_change: Callable[[], None]) -> None:
        self._key, self._on_change = key, on_change
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((bind, 0))
        self._listener.listen(256)
        self.address = "%s:%d" % (bind, self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._tasks: List[Task] = []
        self._closed = False
        threading.Thread(target=self._accept, name="hvlite-spark-register", daemon=True).start()

    def tasks(self) -> List[Task]:
        """The live tasks, in the order they registered."""
        with self._lock:
            return [t for t in self._tasks if t.alive]

    def setup(self, task: Task, env: Dict[str, str], timeout: float = 30.0) -> bool:
        """Send ``task`` its rank process's variables; True once it confirmed."""
        task.ready.clear()
        try:
            task.channel.send("setup", json.dumps({"env": env}).encode("utf-8"))
        except ChannelError:
            return False
        return task.ready.wait(timeout)

    def close(self) -> None:
        """End every task (their registrations close) and the server. Safe twice."""
        with self._lock:
            self._closed = True
            tasks = list(self._tasks)
        try:
            self._listener.close()
        except OSError:
            pass
        for task in tasks:
            task.channel.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            channel = Channel(sock, self._key, server=True).handshake()
            kind, data = channel.recv()
            if kind != "register":
                channel.close()
                return
            task = Task(channel, json.loads(data.decode("utf-8")))
        except (ChannelError, ValueError, KeyError, OSError):
            return
        with self._lock:
            if self._closed:
                channel.close()
                return
            self._tasks.append(task)
        self._on_change()
        try:
            while True:
                kind, _ = channel.recv()
                if kind == "ready":
                    task.ready.set()
        except ChannelError:
            pass
        task.alive = False
        channel.close()
        with self._lock:
            closed = self._closed
        if not closed:
            self._on_change()


def wait_for(predicate: Callable[[], bool], timeout: float, failed: Callable[[], Optional[str]]
             ) -> Optional[str]:
    """Wait until ``predicate()``; return None, or why not: ``failed()``'s answer (checked as it
    goes) or ``"timeout"``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        why = failed()
        if why:
            return why
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.1)
    return None
