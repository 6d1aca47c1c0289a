"""The coordinator's decisions for one task, as pure transitions: no Redis, no Celery, no clock.

Every entry point of :class:`TaskMachine` takes the persisted :class:`TaskRecord`, the input (an
observation, a deadline, a review decision) and ``now``, mutates the record, and returns the
:class:`Effects` the service must carry out *atomically with saving the record*: dispatches,
journal entries, lifecycle events, review items and dead letters. Because the record and the
effects are committed together and every observation is checked against the fence the task
awaits, an observation delivered twice is applied once.

The machine is made of sections, one module each, that call each other through it
(``machine.steps.start(0)``, ``machine.acting.dispatch(...)``):

========================  ===============================================================
``task``                  the entry points (:class:`TaskMachine`) and :func:`decide`
``core``                  settings, effects, the record's helpers (fences, journal, events)
``planning``              a task without steps asks the model for a plan
``steps``                 start, complete, skip a step; finish the task keeping milestones
``reasoning``             Reason and Gate: the reasoning dispatch and its answer
``acting``                Act: tool dispatches, at most ``max_concurrent_tools`` at once
``observing``             Observe: results in, ``done_when``, the stagnation detector
``prehydration``          the goal's references resolved before the first step
``limits``                failed attempts against the progress tracker's limits
``reviews``               escalation to a human and the decision applied
``redelivery``            worker failures, deadlines, re-sends and dead letters
``delegation``            sub-agents: ``delegate`` calls as child tasks, their ends applied
``critics``               a step's result reviewed by its critic before it completes
``outages``               a provider or policy engine down: the dispatch held, no attempt used
``approvals``             tool calls a gate held for a human (``Ask``): approve, edit, reject
========================  ===============================================================
"""

from coordinator.machine.core import Effects, MachineSettings
from coordinator.machine.planning import PLAN_FENCE_STEP, PLAN_PROMPT, parse_plan
from coordinator.machine.task import DEFAULT_SYSTEM_PROMPT, TaskMachine, decide

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "PLAN_FENCE_STEP",
    "PLAN_PROMPT",
    "Effects",
    "MachineSettings",
    "TaskMachine",
    "decide",
    "parse_plan",
]
